package launch

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"go.yaml.in/yaml/v3"
)

// DeepSpeedConfig returns a DeepSpeed JSON config for the plan: batch
// sizes, gradient accumulation (= micro-batches per step), ZeRO stage and
// precision. DeepSpeed checks train_batch_size = micro × accumulation × dp.
func DeepSpeedConfig(j Job) ([]byte, error) {
	r, err := resolve(j)
	if err != nil {
		return nil, err
	}
	if r.Training.GlobalBatch == 0 {
		return nil, fmt.Errorf("launch %s: DeepSpeed needs a global batch size (model global_batch or plan micro_batches)", j.Name)
	}
	type enabled struct {
		Enabled bool `json:"enabled"`
	}
	cfg := struct {
		TrainBatchSize   int     `json:"train_batch_size"`
		MicroBatchPerGPU int     `json:"train_micro_batch_size_per_gpu"`
		GradAccumulation int     `json:"gradient_accumulation_steps"`
		GradientClipping float64 `json:"gradient_clipping"`
		ZeRO             struct {
			Stage           int  `json:"stage"`
			OverlapComm     bool `json:"overlap_comm"`
			ContiguousGrads bool `json:"contiguous_gradients"`
		} `json:"zero_optimization"`
		BF16          *enabled `json:"bf16,omitempty"`
		FP16          *enabled `json:"fp16,omitempty"`
		StepsPerPrint int      `json:"steps_per_print"`
		WallClock     bool     `json:"wall_clock_breakdown"`
	}{
		TrainBatchSize:   r.Training.GlobalBatch,
		MicroBatchPerGPU: r.Plan.MicroBatch,
		GradAccumulation: r.Plan.NumMicroBatches,
		GradientClipping: 1.0,
		StepsPerPrint:    10,
	}
	cfg.ZeRO.Stage = r.Training.ZeROStage
	cfg.ZeRO.OverlapComm = r.Training.ZeROStage > 0
	cfg.ZeRO.ContiguousGrads = r.Training.ZeROStage > 0
	if r.Training.Precision == costmodel.PrecisionFP16 {
		cfg.FP16 = &enabled{true}
	} else {
		cfg.BF16 = &enabled{true}
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("launch %s: encode DeepSpeed config: %w", j.Name, err)
	}
	return append(out, '\n'), nil
}

// Torchrun returns the environment and the torchrun command for one node.
// nodeRank and masterAddr may be shell expressions ("$NODE_RANK"); with a
// placement and an empty masterAddr the first node is the master.
func Torchrun(j Job, nodeRank, masterAddr string) (env []string, argv []string, err error) {
	r, err := resolve(j)
	if err != nil {
		return nil, nil, err
	}
	if masterAddr == "" {
		if r.Placement == nil {
			return nil, nil, fmt.Errorf("launch %s: torchrun needs the master address, or a placement whose first node is the master", j.Name)
		}
		masterAddr = r.Placement.Nodes[0]
	}
	for _, kv := range r.env() {
		env = append(env, kv[0]+"="+kv[1])
	}
	env = append(env, "MASTER_ADDR="+masterAddr, "MASTER_PORT="+strconv.Itoa(r.port))
	argv = append([]string{"torchrun",
		"--nnodes", strconv.Itoa(r.nodes),
		"--nproc-per-node", strconv.Itoa(r.gpn),
		"--node-rank", nodeRank,
		"--master-addr", masterAddr,
		"--master-port", strconv.Itoa(r.port),
	}, r.rankCommand()...)
	return env, argv, nil
}

// TorchrunScript returns a bash script that starts this node's ranks; the
// node's rank comes from $NODE_RANK and, without a placement, the master
// from $MASTER_ADDR.
func TorchrunScript(j Job) (string, error) {
	r, err := resolve(j)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("#!/bin/bash\n")
	fmt.Fprintf(&b, "# %s: %s on %d node(s) × %d GPUs. Run once per node with NODE_RANK=0..%d.\n", r.Name, r.Plan, r.nodes, r.gpn, r.nodes-1)
	b.WriteString("set -euo pipefail\n")
	b.WriteString(": \"${NODE_RANK:?set NODE_RANK to this node's index}\"\n")
	if r.Placement != nil {
		fmt.Fprintf(&b, "export MASTER_ADDR=%s\n", quote(r.Placement.Nodes[0]))
	} else {
		b.WriteString(": \"${MASTER_ADDR:?set MASTER_ADDR to node 0's address}\"\n")
	}
	fmt.Fprintf(&b, "export MASTER_PORT=%d\n", r.port)
	for _, kv := range r.env() {
		fmt.Fprintf(&b, "export %s=%s\n", kv[0], quote(kv[1]))
	}
	fmt.Fprintf(&b, "exec torchrun --nnodes %d --nproc-per-node %d --node-rank \"$NODE_RANK\" \\\n", r.nodes, r.gpn)
	b.WriteString("  --master-addr \"$MASTER_ADDR\" --master-port \"$MASTER_PORT\" \\\n  ")
	b.WriteString(shellJoin(r.rankCommand(), "  "))
	b.WriteByte('\n')
	return b.String(), nil
}

// SlurmScript returns an sbatch script: one task per node running torchrun
// with c10d rendezvous on the first node, SIGUSR1 two minutes before the
// time limit so ranks checkpoint, and requeue on node failure.
func SlurmScript(j Job) (string, error) {
	r, err := resolve(j)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString("#!/bin/bash\n")
	fmt.Fprintf(&b, "#SBATCH --job-name=%s\n", r.Name)
	fmt.Fprintf(&b, "#SBATCH --nodes=%d\n", r.nodes)
	b.WriteString("#SBATCH --ntasks-per-node=1\n")
	fmt.Fprintf(&b, "#SBATCH --gpus-per-node=%d\n", r.gpn)
	if r.Placement != nil {
		fmt.Fprintf(&b, "#SBATCH --nodelist=%s\n", strings.Join(r.Placement.Nodes, ","))
	}
	b.WriteString("#SBATCH --exclusive\n")
	b.WriteString("#SBATCH --signal=USR1@120\n")
	b.WriteString("#SBATCH --requeue\n")
	fmt.Fprintf(&b, "#SBATCH --output=%s-%%j.out\n", r.Name)
	fmt.Fprintf(&b, "# plan: %s\n", r.Plan)
	b.WriteString("set -euo pipefail\n")
	for _, kv := range r.env() {
		fmt.Fprintf(&b, "export %s=%s\n", kv[0], quote(kv[1]))
	}
	b.WriteString("MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\n")
	fmt.Fprintf(&b, "MASTER_PORT=%d\n", r.port)
	b.WriteString("export MASTER_ADDR MASTER_PORT\n")
	// --signal reaches every process of the step; torchrun would die of
	// SIGUSR1's default action, so it (and, until they install their
	// checkpoint handler, the ranks it starts) ignores it.
	b.WriteString("# torchrun ignores SIGUSR1; the ranks catch it and checkpoint.\n")
	fmt.Fprintf(&b, "srun --kill-on-bad-exit=1 bash -c 'trap \"\" USR1; exec \"$0\" \"$@\"' \\\n  torchrun --nnodes \"$SLURM_NNODES\" --nproc-per-node %d \\\n", r.gpn)
	b.WriteString("  --rdzv-id \"$SLURM_JOB_ID\" --rdzv-backend c10d --rdzv-endpoint \"$MASTER_ADDR:$MASTER_PORT\" \\\n  ")
	b.WriteString(shellJoin(r.rankCommand(), "  "))
	b.WriteByte('\n')
	return b.String(), nil
}

// KubernetesManifest returns a headless Service and an indexed Job with one
// pod per node: each pod takes a whole node's GPUs (nvidia.com/gpu), pods
// repel each other per host, and with a placement they are held to the
// placed nodes by node affinity. Pod index i is torchrun's node rank i;
// pod 0 is the rendezvous master.
func KubernetesManifest(j Job) (string, error) {
	r, err := resolve(j)
	if err != nil {
		return "", err
	}
	image := r.Image
	if image == "" {
		image = DefaultImage
	}
	labels := map[string]any{"app.kubernetes.io/managed-by": "gpuctl", "gpuctl.io/job": r.Name}
	meta := map[string]any{"name": r.Name, "labels": labels}
	if r.Namespace != "" {
		meta["namespace"] = r.Namespace
	}
	svc := map[string]any{
		"apiVersion": "v1",
		"kind":       "Service",
		"metadata":   meta,
		"spec": map[string]any{
			"clusterIP":                "None",
			"selector":                 map[string]any{"gpuctl.io/job": r.Name},
			"publishNotReadyAddresses": true,
			"ports":                    []any{map[string]any{"name": "rendezvous", "port": r.port}},
		},
	}
	env := []any{
		map[string]any{"name": "NODE_RANK", "valueFrom": map[string]any{"fieldRef": map[string]any{
			"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
		map[string]any{"name": "MASTER_ADDR", "value": fmt.Sprintf("%s-0.%s", r.Name, r.Name)},
		map[string]any{"name": "MASTER_PORT", "value": strconv.Itoa(r.port)},
	}
	for _, kv := range r.env() {
		env = append(env, map[string]any{"name": kv[0], "value": kv[1]})
	}
	args := append([]string{"torchrun",
		"--nnodes", strconv.Itoa(r.nodes),
		"--nproc-per-node", strconv.Itoa(r.gpn),
		"--node-rank", "$(NODE_RANK)",
		"--master-addr", "$(MASTER_ADDR)",
		"--master-port", "$(MASTER_PORT)",
	}, r.rankCommand()...)
	affinity := map[string]any{
		"podAntiAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": []any{map[string]any{
			"labelSelector": map[string]any{"matchLabels": map[string]any{"gpuctl.io/job": r.Name}},
			"topologyKey":   "kubernetes.io/hostname",
		}}},
	}
	if r.Placement != nil {
		affinity["nodeAffinity"] = map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
			"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{
				"key": "kubernetes.io/hostname", "operator": "In", "values": r.Placement.Nodes,
			}}}},
		}}
	}
	gpu := map[string]any{"nvidia.com/gpu": r.gpn}
	job := map[string]any{
		"apiVersion": "batch/v1",
		"kind":       "Job",
		"metadata":   meta,
		"spec": map[string]any{
			"completionMode": "Indexed",
			"completions":    r.nodes,
			"parallelism":    r.nodes,
			// gpuctl, not the Job controller, decides how to recover.
			"backoffLimit": 0,
			"template": map[string]any{
				"metadata": map[string]any{"labels": labels},
				"spec": map[string]any{
					"subdomain":     r.Name,
					"restartPolicy": "Never",
					"affinity":      affinity,
					"containers": []any{map[string]any{
						"name":    "trainer",
						"image":   image,
						"command": args,
						"env":     env,
						"ports":   []any{map[string]any{"name": "rendezvous", "containerPort": r.port}},
						"resources": map[string]any{
							"limits":   gpu,
							"requests": gpu,
						},
						"volumeMounts": []any{map[string]any{"name": "dshm", "mountPath": "/dev/shm"}},
					}},
					// NCCL's shared-memory transport needs more than the
					// container default of 64 MiB.
					"volumes": []any{map[string]any{"name": "dshm", "emptyDir": map[string]any{"medium": "Memory"}}},
				},
			},
		},
	}
	var b bytes.Buffer
	b.WriteString("# " + r.Name + ": " + r.Plan.String() + "\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	for _, doc := range []any{svc, job} {
		if err := enc.Encode(doc); err != nil {
			return "", fmt.Errorf("launch %s: encode manifest: %w", j.Name, err)
		}
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("launch %s: encode manifest: %w", j.Name, err)
	}
	return b.String(), nil
}
