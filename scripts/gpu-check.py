#!/usr/bin/env python3
"""The parts of scripts/gpu-check.sh that want more than the shell.

compare:   nodemon's GPU counters (`gpuctl gpus -o json`) against
           `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`;
           prints one line saying what matched, exits 1 on a mismatch.
allreduce: a torch.distributed NCCL all-reduce loop, run by nodemon as a
           gpuctl job's rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
           and CUDA_VISIBLE_DEVICES come from nodemon).
"""

import argparse
import csv
import json
import os
import sys
import time

# The columns gpu-check.sh asks nvidia-smi for, in order.
SMI_FIELDS = ["index", "uuid", "name", "memory.total", "memory.used", "temperature.gpu",
              "power.draw", "power.limit", "utilization.gpu", "clocks.sm"]

MIB = 1 << 20


def number(s):
    """A figure of nvidia-smi's, or None where it has none ([N/A], [Not Supported])."""
    s = s.strip()
    try:
        return float(s)
    except ValueError:
        return None


def compare(gpus_path, smi_path, node):
    with open(gpus_path) as f:
        ours = [g for g in json.load(f)["gpus"] if not node or g["node"] == node]
    with open(smi_path) as f:
        rows = [r for r in csv.reader(f, skipinitialspace=True) if r]
    theirs = {}
    for r in rows:
        if len(r) != len(SMI_FIELDS):
            return [f"nvidia-smi row has {len(r)} fields, want {len(SMI_FIELDS)}: {r}"], 0
        row = dict(zip(SMI_FIELDS, (c.strip() for c in r)))
        theirs[row["uuid"]] = row
    problems = []
    if len(ours) != len(theirs):
        problems.append(f"nodemon reports {len(ours)} GPUs, nvidia-smi {len(theirs)}")
    checked = 0
    for g in ours:
        row = theirs.get(g["uuid"])
        if row is None:
            problems.append(f"GPU {g['index']} {g['uuid']}: not in nvidia-smi's list")
            continue
        checked += 1
        where = f"GPU {g['index']} ({g['uuid']})"
        if str(g["index"]) != row["index"]:
            problems.append(f"{where}: index {g['index']}, nvidia-smi {row['index']}")
        if g["model"] != row["name"]:
            problems.append(f"{where}: model {g['model']!r}, nvidia-smi {row['name']!r}")
        # Fixed figures must agree; moving ones within what a second
        # between the two samples can change.
        checks = [
            ("memory total MiB", g["mem_total_bytes"] / MIB, number(row["memory.total"]), 1, 0),
            # nvidia-smi may leave the driver's reserved memory out of used
            # (NVML's v2 memory info), nodemon's NVML call counts it.
            ("memory used MiB", none_div(g["mem_used_bytes"], MIB), number(row["memory.used"]), 1024, 0.05),
            ("temperature C", g["temperature_celsius"], number(row["temperature.gpu"]), 5, 0),
            ("power W", g["power_watts"], number(row["power.draw"]), 50, 0.25),
            ("power limit W", g["power_limit_watts"], number(row["power.limit"]), 1, 0),
            ("utilization %", g["util_percent"], number(row["utilization.gpu"]), 30, 0),
            ("SM clock MHz", g["sm_clock_mhz"], number(row["clocks.sm"]), 200, 0.1),
        ]
        for what, a, b, slack, share in checks:
            if b is None:
                continue  # nvidia-smi has no figure: nothing to hold ours to
            if a is None:
                problems.append(f"{where}: {what}: nodemon has none, nvidia-smi {b:g}")
            elif abs(a - b) > slack + share * abs(b):
                problems.append(f"{where}: {what}: nodemon {a:g}, nvidia-smi {b:g}")
    return problems, checked


def none_div(a, b):
    return None if a is None else a / b


def allreduce(seconds, elems):
    import torch
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    lib = sorted({line.split()[-1] for line in open("/proc/self/maps") if "libnccl" in line})
    print(f"torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, rank {dist.get_rank()} of "
          f"{dist.get_world_size()}, libnccl {lib}", flush=True)
    x = torch.ones(elems, device="cuda")
    end, steps = time.time() + seconds, 0
    while time.time() < end:
        dist.all_reduce(x)
        torch.cuda.synchronize()
        steps += 1
        if steps % 100 == 0:
            print(f"step {steps}", flush=True)
        time.sleep(0.005)
    want = float(dist.get_world_size()) ** steps
    dist.destroy_process_group()
    print(f"done: {steps} all-reduces of {elems} floats, x[0]={x[0].item():g} (want {want:g})", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--gpus", required=True, help="gpuctl gpus -o json")
    c.add_argument("--smi", required=True, help="nvidia-smi --query-gpu=%s --format=csv,noheader,nounits" % ",".join(SMI_FIELDS))
    c.add_argument("--node", default="", help="only this node's GPUs")
    a = sub.add_parser("allreduce")
    a.add_argument("--seconds", type=float, default=20)
    a.add_argument("--elems", type=int, default=1 << 20)
    args = p.parse_args()
    if args.cmd == "compare":
        problems, checked = compare(args.gpus, args.smi, args.node)
        if problems:
            print("; ".join(problems))
            sys.exit(1)
        print(f"{checked} GPUs: uuid, index, model, memory, temperature, power, utilization and SM clock agree with nvidia-smi")
    else:
        allreduce(args.seconds, args.elems)


if __name__ == "__main__":
    main()
