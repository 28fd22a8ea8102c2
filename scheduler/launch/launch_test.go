package launch

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"go.yaml.in/yaml/v3"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// golden compares got with testdata/name.golden, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (run go test -update after checking):\n%s", name, path, got)
	}
}

// llamaJob is llama2-70b on 4 nodes × 8 H100: tp 8, pp 2 interleaved, dp 2.
func llamaJob(t *testing.T, placed bool) Job {
	t.Helper()
	m, tr, err := costmodel.LookupModel("llama2-70b")
	if err != nil {
		t.Fatal(err)
	}
	tr.GlobalBatch = 64
	j := Job{
		Name:          "llama-70b",
		Command:       []string{"python", "pretrain_gpt.py", "--data-path", "/data/my corpus"},
		Env:           map[string]string{"NCCL_DEBUG": "WARN", "WANDB_PROJECT": "it's-70b"},
		Model:         &m,
		Training:      tr,
		Plan:          costmodel.Plan{TP: 8, PP: 2, DP: 2, MicroBatch: 1, VirtualStages: 2},
		CheckpointDir: "/ckpt/llama-70b",
		Namespace:     "training",
	}
	if placed {
		j.Placement = &Placement{Nodes: []string{"gpu-a01", "gpu-a02", "gpu-b01", "gpu-b02"}, GPUsPerNode: 8}
	}
	return j
}

func TestMegatronArgs(t *testing.T) {
	args, err := MegatronArgs(llamaJob(t, false))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "megatron", strings.Join(args, "\n")+"\n")
	want := map[string]string{
		"--tensor-model-parallel-size": "8", "--pipeline-model-parallel-size": "2",
		"--num-layers-per-virtual-pipeline-stage": "20", "--micro-batch-size": "1", "--global-batch-size": "64",
		"--num-query-groups": "8", "--recompute-granularity": "selective",
	}
	for i, a := range args {
		if v, ok := want[a]; ok {
			if args[i+1] != v {
				t.Errorf("%s %s, want %s", a, args[i+1], v)
			}
			delete(want, a)
		}
	}
	if len(want) > 0 {
		t.Errorf("missing arguments: %v", want)
	}
}

// TestMegatronArgsContextParallel: a plan with cp > 1 tells Megatron-LM,
// or its world of tp × cp × pp × dp ranks would read as more data
// parallelism.
func TestMegatronArgsContextParallel(t *testing.T) {
	j := llamaJob(t, false)
	j.Plan = costmodel.Plan{TP: 8, CP: 2, PP: 2, DP: 1, MicroBatch: 1, VirtualStages: 2}
	args, err := MegatronArgs(j)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.Index(args, "--context-parallel-size")
	if i < 0 || args[i+1] != "2" {
		t.Errorf("no --context-parallel-size 2 in %v", args)
	}
}

func TestDeepSpeedConfig(t *testing.T) {
	j := llamaJob(t, false)
	j.Training.ZeROStage = 2
	out, err := DeepSpeedConfig(j)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "deepspeed", string(out))
	var cfg struct {
		Train int `json:"train_batch_size"`
		Micro int `json:"train_micro_batch_size_per_gpu"`
		Acc   int `json:"gradient_accumulation_steps"`
		ZeRO  struct {
			Stage int `json:"stage"`
		} `json:"zero_optimization"`
		BF16 struct {
			Enabled bool `json:"enabled"`
		} `json:"bf16"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	// DeepSpeed's own consistency rule.
	if cfg.Train != cfg.Micro*cfg.Acc*j.Plan.DP || cfg.ZeRO.Stage != 2 || !cfg.BF16.Enabled {
		t.Fatalf("config %+v", cfg)
	}
}

func TestTorchrun(t *testing.T) {
	script, err := TorchrunScript(llamaJob(t, false))
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "torchrun", script)
	env, argv, err := Torchrun(llamaJob(t, true), "2", "")
	if err != nil {
		t.Fatal(err)
	}
	joined := strings.Join(argv, " ")
	for _, want := range []string{"torchrun --nnodes 4 --nproc-per-node 8 --node-rank 2 --master-addr gpu-a01 --master-port 29500 python pretrain_gpt.py"} {
		if !strings.HasPrefix(joined, want) {
			t.Errorf("argv %q lacks %q", joined, want)
		}
	}
	if !strings.Contains(strings.Join(env, "\n"), "GPUCTL_CHECKPOINT_DIR=/ckpt/llama-70b") {
		t.Errorf("env %v lacks the checkpoint dir", env)
	}
	if _, _, err := Torchrun(llamaJob(t, false), "0", ""); err == nil {
		t.Error("torchrun without master or placement accepted")
	}
}

func TestSlurm(t *testing.T) {
	for _, placed := range []bool{true, false} {
		script, err := SlurmScript(llamaJob(t, placed))
		if err != nil {
			t.Fatal(err)
		}
		name := "slurm"
		if placed {
			name = "slurm-placed"
			if !strings.Contains(script, "#SBATCH --nodelist=gpu-a01,gpu-a02,gpu-b01,gpu-b02\n") {
				t.Error("placed script lacks --nodelist")
			}
		} else if strings.Contains(script, "--nodelist") {
			t.Error("unplaced script pins nodes")
		}
		for _, want := range []string{"#SBATCH --nodes=4\n", "#SBATCH --signal=USR1@120\n", "#SBATCH --gpus-per-node=8\n", "srun "} {
			if !strings.Contains(script, want) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
		golden(t, name, script)
	}
}

func TestKubernetes(t *testing.T) {
	for _, placed := range []bool{true, false} {
		out, err := KubernetesManifest(llamaJob(t, placed))
		if err != nil {
			t.Fatal(err)
		}
		name := "k8s"
		if placed {
			name = "k8s-placed"
		}
		golden(t, name, out)
		// It must be valid YAML: a Service then an indexed Job.
		dec := yaml.NewDecoder(strings.NewReader(out))
		var kinds []string
		var job map[string]any
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); err != nil {
				break
			}
			kinds = append(kinds, doc["kind"].(string))
			job = doc
		}
		if strings.Join(kinds, ",") != "Service,Job" {
			t.Fatalf("%s kinds %v", name, kinds)
		}
		spec := job["spec"].(map[string]any)
		if spec["completions"] != 4 || spec["completionMode"] != "Indexed" {
			t.Errorf("%s job spec %v", name, spec)
		}
		hasAffinity := strings.Contains(out, "nodeAffinity")
		if hasAffinity != placed {
			t.Errorf("%s: nodeAffinity present %v, placed %v", name, hasAffinity, placed)
		}
		if !strings.Contains(out, "nvidia.com/gpu: 8") {
			t.Errorf("%s lacks the GPU resource", name)
		}
	}
}

func TestResolveRefuses(t *testing.T) {
	tests := []struct {
		name string
		edit func(*Job)
		want string
	}{
		{"bad name", func(j *Job) { j.Name = "Llama 70B" }, "not a DNS label"},
		{"no command", func(j *Job) { j.Command = nil }, "no command"},
		{"zero tp", func(j *Job) { j.Plan.TP = 0 }, "positive tp"},
		{"placement count", func(j *Job) { j.Placement = &Placement{Nodes: []string{"a", "b"}} }, "names 2 nodes, the plan needs 4"},
		{"placement repeat", func(j *Job) { j.Placement = &Placement{Nodes: []string{"a", "a", "b", "c"}} }, "repeated"},
		{"gpus per node mismatch", func(j *Job) {
			j.GPUsPerNode = 4
			j.Placement = &Placement{Nodes: []string{"a", "b", "c", "d"}, GPUsPerNode: 8}
		}, "disagrees"},
		{"partial nodes", func(j *Job) { j.GPUsPerNode = 6 }, "not whole nodes"},
		{"tp beyond node", func(j *Job) { j.GPUsPerNode = 4 }, "tp 8 exceeds the 4 GPUs per node"},
		{"batch", func(j *Job) { j.Training.GlobalBatch = 63 }, "not divisible"},
		{"virtual stages", func(j *Job) { j.Plan.VirtualStages = 3 }, "do not split"},
		{"port", func(j *Job) { j.MasterPort = 70000 }, "not a TCP port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := llamaJob(t, false)
			tt.edit(&j)
			_, err := SlurmScript(j)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want %q", err, tt.want)
			}
		})
	}
	j := llamaJob(t, false)
	j.Model = nil
	if _, err := MegatronArgs(j); err == nil || !strings.Contains(err.Error(), "need a model") {
		t.Fatalf("Megatron args without a model: %v", err)
	}
	// A job without a model still launches: the command runs as given.
	s, err := SlurmScript(j)
	if err != nil || strings.Contains(s, "--tensor-model-parallel-size") {
		t.Fatalf("model-less slurm script: %v\n%s", err, s)
	}
}

func TestQuote(t *testing.T) {
	for in, want := range map[string]string{"plain": "plain", "/a/b.py": "/a/b.py", "a b": "'a b'", "it's": `'it'\''s'`, "": "''", "$HOME": "'$HOME'"} {
		if got := quote(in); got != want {
			t.Errorf("quote(%q) = %s, want %s", in, got, want)
		}
	}
}
