#!/usr/bin/env bash
# gpu-check: on one GPU host, in one call, run nodemon with real NVML
# against a `gpuctl serve` on loopback, compare its GPU counters with
# nvidia-smi, run a small NCCL all-reduce loop as a gpuctl job and check
# that nodemon traced its calls from the libnccl.so.2 the loop loaded and,
# through gpuctl's NCCL profiler plugin (libnccl-profiler-gpuctl.so beside
# nodemon; NCCL 2.25 or later), when their work completed, and
# write one report (text and JSON) saying what passed, failed, or could
# not run and why.
#
# Without a GPU (or with --simulate) it runs the same steps against
# simulated GPUs (nodemon --sim dgx-h200) and the reference workload
# (workload/build: ringtrain on its libnccl.so.2, completing collectives
# asynchronously as a GPU does) in place of PyTorch, and the report says so.
#
#   scripts/gpu-check.sh [--simulate] [--bin DIR] [--workload DIR] [--out DIR] [--seconds N]
#
# --bin      gpuctl and nodemon (default: bin/gpu-check, made by
#            `make gpu-check-bundle`, else bin/)
# --workload ringtrain and libnccl.so.2 (default: workload/build)
# --out      where the report goes (default: $OUT when set, else gpu-check-out)
# --seconds  how long the all-reduce loop runs (default 20)
#
# GPU_CHECK_NVIDIA_SMI names the nvidia-smi to compare with (default:
# nvidia-smi on PATH). Exit status: 0 when nothing failed, 1 otherwise.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=""
workload="$root/workload/build"
out="${OUT:-$root/gpu-check-out}"
seconds=20
simulate=""
while [ $# -gt 0 ]; do
	case "$1" in
	--simulate) simulate="asked for (--simulate)" ;;
	--bin) bin="$2"; shift ;;
	--workload) workload="$2"; shift ;;
	--out) out="$2"; shift ;;
	--seconds) seconds="$2"; shift ;;
	-h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
	shift
done
if [ -z "$bin" ]; then
	bin="$root/bin/gpu-check"
	[ -x "$bin/nodemon" ] || bin="$root/bin"
fi
case "$seconds" in '' | *[!0-9]*) echo "gpu-check: --seconds wants a whole number, got $seconds" >&2; exit 2 ;; esac

mkdir -p "$out" || { echo "gpu-check: cannot create $out" >&2; exit 2; }
work=$(mktemp -d /tmp/gpu-check.XXXXXX)
logs="$out/gpu-check-logs"
mkdir -p "$logs"
report_txt="$out/gpu-check-report.txt"
report_json="$out/gpu-check-report.json"
results="$work/results.tsv"
: >"$results"
pids=()

# record STATUS STEP DETAIL: one line of the report; STATUS is pass, fail
# or skip (could not run here), DETAIL says what was seen or why.
record() {
	printf '%s\t%s\t%s\n' "$1" "$2" "$(printf '%s' "$3" | tr '\t\n' '  ')" >>"$results"
	printf '%-5s %-12s %s\n' "$1" "$2" "$3" >&2
}

cleanup() {
	# Only the processes this script started, by pid, newest first.
	local i
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill "${pids[$i]}" 2>/dev/null
	done
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		for _ in $(seq 50); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
		kill -9 "${pids[$i]}" 2>/dev/null
	done
	# The logs travel back with the report, trimmed to what explains it.
	local f
	for f in "$work/server.log" "$work/node/nodemon.log" $(find "$work/node" -name 'rank-*.log' 2>/dev/null); do
		[ -f "$f" ] && tail -c 200000 "$f" >"$logs/$(basename "$f")"
	done
	rm -rf "$work"
}
trap 'write_report; cleanup' EXIT
trap 'exit 130' INT TERM

# json_string prints its argument as a JSON string.
json_string() {
	local s=$1
	s=${s//\\/\\\\}
	s=${s//\"/\\\"}
	s=${s//$'\t'/ }
	s=${s//$'\r'/ }
	s=${s//$'\n'/\\n}
	printf '"%s"' "$s"
}

write_report() {
	local status name detail first=1 failed=0
	{
		echo "gpuctl gpu-check on $(uname -n) at $(date -u +%Y-%m-%dT%H:%M:%SZ)"
		echo "mode: $mode"
		echo "took: ${SECONDS}s"
		echo
		while IFS=$'\t' read -r status name detail; do
			printf '%-5s %-12s %s\n' "$status" "$name" "$detail"
		done <"$results"
	} >"$report_txt"
	{
		printf '{"host":%s,"time":%s,"seconds":%d,"mode":%s,"simulated":%s,"steps":[' \
			"$(json_string "$(uname -n)")" "$(json_string "$(date -u +%Y-%m-%dT%H:%M:%SZ)")" "$SECONDS" \
			"$(json_string "$mode")" "$([ -n "$simulate" ] && echo true || echo false)"
		while IFS=$'\t' read -r status name detail; do
			[ "$status" = fail ] && failed=1
			[ $first = 1 ] || printf ','
			first=0
			printf '{"step":%s,"status":%s,"detail":%s}' "$(json_string "$name")" "$(json_string "$status")" "$(json_string "$detail")"
		done <"$results"
		printf '],"passed":%s}\n' "$([ $failed = 0 ] && echo true || echo false)"
	} >"$report_json"
	echo "gpu-check: report in $report_txt and $report_json" >&2
}

# finish exits: 1 when a step failed, else 0 (skips are not failures; the
# report names them).
finish() {
	grep -q '^fail' "$results" && exit 1
	exit 0
}

# wait_for SECONDS CMD...: runs CMD every 0.2 s until it succeeds.
wait_for() {
	local limit=$1
	shift
	local deadline=$((SECONDS + limit))
	while ! "$@" >/dev/null 2>&1; do
		[ $SECONDS -ge $deadline ] && return 1
		sleep 0.2
	done
}

mode=real
if [ -z "$simulate" ]; then
	smi=${GPU_CHECK_NVIDIA_SMI:-nvidia-smi}
	if ! command -v "$smi" >/dev/null 2>&1; then
		simulate="no GPU here: $smi not found"
	elif ! "$smi" -L 2>/dev/null | grep -q '^GPU '; then
		simulate="no GPU here: $smi -L lists none"
	fi
fi
[ -n "$simulate" ] && mode="simulated GPUs (nodemon --sim dgx-h200) and the reference NCCL, $simulate"
record pass mode "$mode"

# --- host: kernel, glibc, what the binaries need -----------------------
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null || echo "glibc unknown")
# The newest glibc symbol version the binaries were linked against.
needs_glibc=$(cat "$bin/gpuctl" "$bin/nodemon" 2>/dev/null | grep -a -o 'GLIBC_2\.[0-9]*' | sort -uV | tail -1)
record pass host "kernel $(uname -r), $glibc, $(nproc) CPUs, uid $(id -u)"
for b in gpuctl nodemon; do
	if [ ! -x "$bin/$b" ]; then
		record fail binaries "$bin/$b missing: run 'make gpu-check-bundle' (or make build) on the build machine"
		exit 1
	fi
	if ! v=$("$bin/$b" --help 2>&1 >/dev/null | head -3) || ! "$bin/$b" --help >/dev/null 2>&1; then
		record fail binaries "$b does not run here ($glibc; it needs ${needs_glibc:-?}): $v; $(ldd "$bin/$b" 2>&1 | grep -i 'not found' | head -3 | tr '\n' ' ')"
		exit 1
	fi
done
record pass binaries "gpuctl and nodemon from $bin run here (they need ${needs_glibc:-?}; $(ldd "$bin/nodemon" 2>&1 | awk '/=>/{print $1}' | tr '\n' ' ' | sed 's/ $//'))"

# --- eBPF prerequisites ---------------------------------------------------
# nodemon's own verdict (eBPF loaded or refused) is read from its log below.
if [ ! -e /sys/kernel/tracing/events ]; then
	mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
ulimit -l unlimited 2>/dev/null || true

# --- server on loopback, one node -----------------------------------------
gpuctl="$bin/gpuctl"
"$gpuctl" serve --listen 127.0.0.1:0 --data-dir "$work/server" --log-file "$work/server.log" --checkpoint-root "$work/ckpt" &
pids+=($!)
cfg="$work/server/admin.yaml"
if ! wait_for 30 test -s "$cfg"; then
	record fail server "gpuctl serve wrote no admin.yaml within 30s: $(tail -5 "$work/server.log" 2>/dev/null)"
	exit 1
fi
export GPUCTL_CONFIG="$cfg"
if ! wait_for 30 "$gpuctl" status; then
	record fail server "gpuctl status does not answer within 30s: $(tail -5 "$work/server.log" 2>/dev/null)"
	exit 1
fi
addr=$(sed -n 's/^server: *//p' "$cfg" | tr -d '"' | head -1)
record pass server "gpuctl serve on $addr"

if ! "$gpuctl" token create --ttl 10m >"$work/token" 2>"$work/token.err"; then
	record fail node "token create: $(cat "$work/token.err")"
	exit 1
fi
node=gpu-check
args=(--server "$addr" --token-file "$work/token" --name "$node" --data-dir "$work/node"
	--log-file "$work/node/nodemon.log" --ebpf auto --allow-root-ranks --interval 1s)
[ -n "$simulate" ] && args+=(--sim dgx-h200)
mkdir -p "$work/node"
"$bin/nodemon" "${args[@]}" &
pids+=($!)
ready() { "$gpuctl" nodes -o json | grep -q '"state": *"ready"'; }
if ! wait_for 60 ready; then
	record fail node "nodemon not ready within 60s: $(tail -5 "$work/node/nodemon.log" 2>/dev/null)"
	exit 1
fi
nvml="real NVML"
[ -n "$simulate" ] && nvml="simulated NVML (dgx-h200)"
record pass node "nodemon $node ready with $nvml"

if grep -q 'eBPF probes unavailable' "$work/node/nodemon.log"; then
	ebpf=$(grep -m1 'eBPF probes unavailable' "$work/node/nodemon.log")
	record skip ebpf "eBPF refused here, so NCCL tracing cannot be checked: $ebpf"
else
	record pass ebpf "nodemon loaded its eBPF probes (uprobes on NCCL, flow tracepoints)"
fi

# --- GPU counters against nvidia-smi --------------------------------------
sampled() {
	"$gpuctl" gpus -o json >"$work/gpus.json" && ! grep -q '"sample_time": *null' "$work/gpus.json" &&
		grep -q '"sample_time"' "$work/gpus.json"
}
if ! wait_for 30 sampled; then
	record fail gpus "no GPU sampled within 30s: $(head -c 300 "$work/gpus.json" 2>/dev/null)"
else
	cp "$work/gpus.json" "$logs/gpus.json"
	smi=${GPU_CHECK_NVIDIA_SMI:-nvidia-smi}
	fields=index,uuid,name,memory.total,memory.used,temperature.gpu,power.draw,power.limit,utilization.gpu,clocks.sm
	if ! command -v python3 >/dev/null 2>&1; then
		record skip gpus "no python3 here to compare with nvidia-smi (gpus.json kept)"
	elif ! command -v "$smi" >/dev/null 2>&1; then
		record skip gpus "no nvidia-smi to compare with ($mode)"
	elif ! "$smi" --query-gpu=$fields --format=csv,noheader,nounits >"$work/smi.csv" 2>"$work/smi.err"; then
		record fail gpus "$smi --query-gpu failed: $(cat "$work/smi.err")"
	else
		cp "$work/smi.csv" "$logs/nvidia-smi.csv"
		if v=$(python3 "$here/gpu-check.py" compare --gpus "$work/gpus.json" --smi "$work/smi.csv" --node "$node" 2>&1); then
			record pass gpus "$v"
		else
			record fail gpus "$v"
		fi
	fi
fi

# check_completions: gpuctl's NCCL profiler plugin (beside nodemon, given
# to the rank as NCCL_PROFILER_PLUGIN) reports when each all-reduce's work
# completed, which on a GPU is later than the call's return (the enqueue).
check_completions() {
	local plugin
	plugin=$(sed -n 's/.*NCCL profiler plugin given to ranks.*plugin=\([^ ]*\).*/\1/p' "$work/node/nodemon.log" | head -1)
	if [ -z "$plugin" ]; then
		record fail profiler "nodemon gave the ranks no NCCL profiler plugin: $(grep -m1 'NCCL profiler plugin' "$work/node/nodemon.log" || echo "no libnccl-profiler-gpuctl.so beside $bin/nodemon (make gpu-check-bundle puts it there)")"
		return
	fi
	completed() {
		"$gpuctl" collectives --job "$job" -o json >"$work/coll.json" &&
			grep -q '"completions": *[1-9]' "$work/coll.json"
	}
	if wait_for 20 completed; then
		cp "$work/coll.json" "$logs/collectives.json"
		local n
		n=$(grep -o '"completions": *[0-9]*' "$work/coll.json" | grep -o '[0-9]*$' | awk '{n += $1} END {print n + 0}')
		record pass profiler "the profiler plugin ($plugin) reported $n completions: collectives are timed by when their work ended, not by the enqueue"
	else
		local v="" seen loaded
		[ -z "$simulate" ] && v=$("$py" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null)
		# The rank ran with NCCL_DEBUG=INFO: its log says whether NCCL
		# loaded the plugin, and the plugin what NCCL gave it.
		ended() { "$gpuctl" jobs "$job" -o json | grep -q '"state": *"\(succeeded\|failed\|cancelled\)"'; }
		wait_for $((seconds + 10)) ended
		local rlog
		rlog=$(find "$work/node" -name 'rank-0.log' -path "*$job*" 2>/dev/null | head -1)
		loaded=$(grep -m1 'PROFILER/Plugin: Loaded' "$rlog" 2>/dev/null | sed 's/.*PROFILER/PROFILER/')
		seen=$(grep -m1 'gpuctl profiler plugin:' "$rlog" 2>/dev/null | sed 's/.*gpuctl profiler plugin: //')
		if [ -n "$loaded" ] && [ -z "$simulate" ] && printf '%s' "$seen" | grep -q ': 0 collectives'; then
			record skip profiler "NCCL${v:+ $v} loaded the plugin ($loaded) but gave it no collective ($seen): a one-rank communicator's all-reduce never reaches a profiler, and NCCL refuses two ranks on one GPU, so completions need a host with two GPUs or more"
		else
			record fail profiler "no completion reported within 20s by $plugin (the plugin needs NCCL 2.25 or later${v:+; this NCCL is $v}; ${loaded:-NCCL did not say it loaded it}; ${seen:-the plugin reported nothing}): timing stays the enqueue's"
		fi
	fi
}

# --- an NCCL all-reduce loop, traced ---------------------------------------
expected=""
jobenv=()
if [ -n "$simulate" ]; then
	expected="$workload/libnccl.so.2"
	command=("$workload/ringtrain" --steps 0 --compute-ms 20 --bytes 64K)
	# Completing asynchronously, as NCCL on a GPU does.
	jobenv=(REFNCCL_ASYNC=1)
	what="ringtrain on the reference $expected (asynchronous)"
	[ -x "$workload/ringtrain" ] || { record fail nccl "no $workload/ringtrain: run 'make workload'"; exit 1; }
else
	py=$(command -v python3 || true)
	if [ -z "$py" ]; then
		record skip nccl "no python3 here: the torch.distributed loop cannot run"
		finish
	fi
	if ! dir=$("$py" -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>"$work/py.err"); then
		record skip nccl "python3 cannot import nvidia.nccl (no nvidia-nccl wheel?): $(tail -1 "$work/py.err")"
		finish
	fi
	if ! "$py" -c 'import torch, torch.distributed as d; assert torch.cuda.is_available(), "CUDA unavailable"; assert d.is_nccl_available(), "no NCCL backend"' 2>"$work/py.err"; then
		record skip nccl "PyTorch cannot run the loop here: $(tail -1 "$work/py.err")"
		finish
	fi
	expected="$dir/libnccl.so.2"
	[ -e "$expected" ] || expected=$(find / -xdev -name libnccl.so.2 2>/dev/null | head -1)
	command=("$py" "$here/gpu-check.py" allreduce --seconds "$seconds")
	# NCCL says in the rank's log whether it loaded the profiler plugin,
	# and (at NCCL_DEBUG=INFO) the plugin what NCCL gave it.
	jobenv=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV)
	what="torch.distributed all_reduce (world size 1: NCCL refuses two ranks on one GPU) on $expected"
fi
spec="$work/job.yaml"
{
	echo "name: gpu-check-nccl"
	echo "nodes: 1"
	echo "gpus_per_node: 1"
	printf 'command: ['
	sep=""
	for a in "${command[@]}"; do printf '%s"%s"' "$sep" "$a"; sep=", "; done
	echo "]"
	echo "env:"
	for kv in "${jobenv[@]}"; do printf '  %s: "%s"\n' "${kv%%=*}" "${kv#*=}"; done
} >"$spec"
if ! job=$("$gpuctl" submit -f "$spec" 2>"$work/submit.err"); then
	record fail nccl "submit: $(cat "$work/submit.err")"
	exit 1
fi
job=$(printf '%s' "$job" | tail -1 | awk '{print $NF}')
running() { "$gpuctl" jobs "$job" -o json | grep -q '"pid": *[1-9]'; }
if ! wait_for 60 running; then
	record fail nccl "job $job has no running rank within 60s: $("$gpuctl" jobs "$job" -o json 2>&1 | head -c 400)"
	exit 1
fi
pid=$("$gpuctl" jobs "$job" -o json | grep -o '"pid": *[0-9]*' | head -1 | grep -o '[0-9]*$')
traced() {
	"$gpuctl" collectives --job "$job" -o json >"$work/coll.json" &&
		grep -q '"op": *"allreduce"' "$work/coll.json" && grep -q '"calls": *[1-9]' "$work/coll.json"
}
if grep -q 'eBPF probes unavailable' "$work/node/nodemon.log"; then
	record skip nccl "the loop ran ($what, job $job pid $pid) but eBPF is refused here: nothing traced it"
elif wait_for $((seconds + 30)) traced; then
	cp "$work/coll.json" "$logs/collectives.json"
	# Which libnccl the rank mapped (through its own root, as nodemon reads it).
	mapped=$(awk '$6 ~ /libnccl\.so/ {print $6}' "/proc/$pid/maps" 2>/dev/null | sort -u | head -1)
	if [ -z "$mapped" ]; then
		# The loop has ended: it printed the library it mapped in its log.
		mapped=$(find "$work/node" -name 'rank-0.log' -path "*$job*" -exec sed -n "s/.*libnccl \['\([^']*\)'.*/\1/p" {} + 2>/dev/null | head -1)
	fi
	calls=$(grep -o '"calls": *[0-9]*' "$work/coll.json" | grep -o '[0-9]*$' | awk '{n += $1} END {print n + 0}')
	if [ -n "$mapped" ] && [ -n "$expected" ] && [ "$(readlink -f "$mapped")" != "$(readlink -f "$expected")" ]; then
		record fail nccl "traced $calls calls, but rank pid $pid mapped $mapped, not $expected"
	else
		record pass nccl "nodemon traced $calls NCCL calls (allreduce) of job $job pid $pid: $what${mapped:+, mapped $mapped}"
	fi
	check_completions
else
	ranklog=$(find "$work/node" -name 'rank-0.log' -path "*$job*" -exec tail -n 3 {} + 2>/dev/null)
	attach=$(grep -m 3 'NCCL probe\|NCCL libraries' "$work/node/nodemon.log" 2>/dev/null)
	record fail nccl "job $job (pid $pid, $what) ran, but nodemon traced no allreduce within $((seconds + 30))s: $(head -c 300 "$work/coll.json" 2>/dev/null); rank 0's log ends: $ranklog; nodemon on NCCL: ${attach:-nothing logged}"
fi
"$gpuctl" cancel "$job" >/dev/null 2>&1 || true
finish
