package jobspec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestExampleParses(t *testing.T) {
	s, err := ParseFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		t.Fatalf("example.yaml: %v", err)
	}
	if s.Name != "gpt3-pretrain" || s.TotalGPUs() != 1024 || s.GPUModel != "h100" || s.Restarts() != 5 ||
		s.Checkpoint.Interval != 30*time.Minute || s.Checkpoint.IntervalAuto || s.EstimatedRuntime != 72*time.Hour || s.RestartPolicy != ReplaceNode ||
		s.StallRecovery != StallAuto || s.SlowRecovery != SlowAuto {
		t.Fatalf("example parsed to %+v", s)
	}
	m, tr, ok, err := s.CostModel()
	if err != nil || !ok || m.Layers != 96 || tr.GlobalBatch != 1536 || tr.ZeROStage != 1 {
		t.Fatalf("CostModel() = %+v %+v %v %v", m, tr, ok, err)
	}
	p, ok := s.FixedPlan()
	if !ok || p.TP != 8 || p.PP != 8 || p.DP != 16 || p.MicroBatch != 1 || p.NumMicroBatches != 96 || p.VirtualStages != 2 {
		t.Fatalf("FixedPlan() = %+v", p)
	}
}

// TestUnevenAndContextParallelPlansAreWritable: a job file says every
// layout the planner can choose. BLOOM's published 70 layers on 12 stages
// (the first and last stages carry the embedding and output layers) and a
// Llama 3-style tp 8 × cp 2 both validate and give the plan they say.
func TestUnevenAndContextParallelPlansAreWritable(t *testing.T) {
	bloom := "name: bloom\ncommand: [x]\ngpus: 384\ngpu_model: a100-80gb\n" +
		"model: {layers: 70, hidden: 14336, heads: 112, seq_len: 2048, vocab: 250880, global_batch: 2048}\n" +
		"plan: {tp: 4, pp: 12}\n"
	s, err := Parse("bloom.yaml", []byte(bloom))
	if err != nil {
		t.Fatalf("BLOOM's layout: %v", err)
	}
	if p, _ := s.FixedPlan(); p.TP != 4 || p.PP != 12 || p.DP != 8 {
		t.Fatalf("BLOOM's plan %+v", p)
	}
	llama := "name: llama\ncommand: [x]\ngpus: 128\nmodel: {preset: llama2-70b}\nplan: {tp: 8, cp: 2, pp: 4, virtual_stages: 5}\n"
	s, err = Parse("llama.yaml", []byte(llama))
	if err != nil {
		t.Fatalf("tp 8 × cp 2 × pp 4, 5 chunks: %v", err)
	}
	if p, _ := s.FixedPlan(); p.TP != 8 || p.CP != 2 || p.PP != 4 || p.DP != 2 || p.VirtualStages != 5 {
		t.Fatalf("cp plan %+v", p)
	}
}

func TestDefaults(t *testing.T) {
	s, err := Parse("job.yaml", []byte("name: a\ncommand: [x]\nnodes: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.GPUsPerNode != 8 || s.TotalGPUs() != 16 || s.RestartPolicy != RestartInPlace ||
		s.Restarts() != DefaultMaxRestarts || s.StallThreshold != 0 {
		t.Fatalf("defaults not applied: %+v", s)
	}
	s, err = Parse("job.yaml", []byte("name: a\ncommand: [x]\ngpus: 8\ncheckpoint: {dir: /ck}\nmax_restarts: 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Checkpoint.Interval != DefaultCheckpointInterval || !s.Checkpoint.IntervalAuto || s.Restarts() != 0 || s.StallRecovery != StallManual || s.SlowRecovery != SlowAlert {
		t.Fatalf("checkpoint interval %s, restarts %d", s.Checkpoint.Interval, s.Restarts())
	}
}

// base is a valid job the validation cases edit.
const base = `name: job
command: [python, train.py]
gpus: 64
`

func TestValidationRules(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		// want is the whole first line of the error.
		want string
	}{
		{"valid", base, ""},
		{"name missing", "command: [x]\ngpus: 8\n", "job.yaml: name: required"},
		{"name not a label", strings.Replace(base, "name: job", "name: My_Job", 1), `job.yaml:1: name: "My_Job" is not a DNS label`},
		{"tenant not a label", base + "tenant: Big Lab\n", `job.yaml:4: tenant: "Big Lab" is not a DNS label`},
		{"long name cut", strings.Replace(base, "name: job", "name: "+strings.Repeat("X", 10<<10), 1),
			`job.yaml:1: name: "` + strings.Repeat("X", 64) + `"… (10240 bytes) is not a DNS label`},
		{"queue not a label", base + "queue: -q\n", `job.yaml:4: queue: "-q" is not a DNS label`},
		{"priority range", base + "priority: 5000\n", "job.yaml:4: priority: 5000 is outside -1000..1000"},
		{"command missing", "name: a\ngpus: 8\n", "job.yaml: command: required"},
		{"command empty program", "name: a\ngpus: 8\ncommand: ['', x]\n", "job.yaml:3: command[0]: the program name is empty"},
		{"env bad key", base + "env:\n  1X: a\n", "job.yaml:5: env.1X: not a valid environment variable name"},
		{"env reserved", base + "env:\n  GPUCTL_CHECKPOINT_DIR: /x\n", "job.yaml:5: env.GPUCTL_CHECKPOINT_DIR: set by gpuctl"},
		{"env rank", base + "env:\n  WORLD_SIZE: '3'\n", "job.yaml:5: env.WORLD_SIZE: set by gpuctl"},
		{"gpus missing", "name: a\ncommand: [x]\n", "job.yaml: gpus: required: give gpus, or nodes and gpus_per_node"},
		{"gpus negative", "name: a\ncommand: [x]\ngpus: -8\n", "job.yaml:3: gpus: -8 is not a positive GPU count"},
		{"gpus and nodes", base + "nodes: 8\n", "job.yaml:4: nodes: give gpus or nodes × gpus_per_node, not both"},
		{"nodes negative", "name: a\ncommand: [x]\nnodes: -1\n", "job.yaml:3: nodes: -1 is not a positive node count"},
		{"gpus per node too many", "name: a\ncommand: [x]\nnodes: 2\ngpus_per_node: 16\n", "job.yaml:4: gpus_per_node: 16 exceeds the 8 GPUs of one node"},
		{"gpus per node negative", "name: a\ncommand: [x]\nnodes: 2\ngpus_per_node: -2\n", "job.yaml:4: gpus_per_node: -2 is not a positive GPU count"},
		{"gpus not whole nodes", "name: a\ncommand: [x]\ngpus: 12\n", "job.yaml:3: gpus: 12 spans nodes but is not a multiple of the 8 GPUs of one node"},
		{"gpus not whole nodes of given size", "name: a\ncommand: [x]\ngpus: 12\ngpus_per_node: 8\n", "job.yaml:3: gpus: 12 is not a whole number of nodes of 8 GPUs"},
		{"gpu model unknown", base + "gpu_model: v100\n", `job.yaml:4: gpu_model: unknown gpu "v100"`},
		{"allow mixed with model", base + "gpu_model: h100\nallow_mixed: true\n", "job.yaml:5: allow_mixed: true contradicts gpu_model h100"},
		{"gpu models", base + "gpu_models: [h100, a100]\ncheckpoint: {dir: /ckpt, reshardable: true}\n", ""},
		{"gpu models and gpu model", base + "gpu_model: h100\ngpu_models: [h100, a100]\n",
			"job.yaml:5: gpu_models: given with gpu_model h100: give gpu_model (one model) or gpu_models (any one of several), not both"},
		{"gpu models and allow mixed", base + "gpu_models: [h100, a100]\nallow_mixed: true\n",
			"job.yaml:5: allow_mixed: true contradicts gpu_models: a job on gpu_models runs on one of them at a time; drop one of the fields"},
		{"gpu models unknown", base + "gpu_models: [h100, v100]\n", `job.yaml:4: gpu_models: unknown gpu "v100"`},
		{"gpu models twice", base + "gpu_models: [a100, a100-80gb]\n", "job.yaml:4: gpu_models: a100 and a100-80gb are the same profile (a100-80gb): list it once"},
		{"reshardable without dir", base + "checkpoint: {reshardable: true}\n", "job.yaml:4: checkpoint.reshardable: needs checkpoint.dir: a job without checkpoints has nothing to reshard"},
		{"preset unknown", base + "model:\n  preset: gpt5\n", `job.yaml:5: model.preset: unknown model preset "gpt5"`},
		{"model without preset incomplete", base + "model:\n  layers: 4\n  global_batch: 8\n", "job.yaml:4: model.hidden: required without a preset"},
		{"model negative", base + "model:\n  preset: gpt3-175b\n  layers: -3\n", "job.yaml:6: model.layers: -3 is negative"},
		{"model heads vs hidden", base + "model: {layers: 2, hidden: 100, heads: 3, seq_len: 8, vocab: 10, global_batch: 64}\n", "job.yaml:4: model.heads: 3 heads do not divide hidden size 100"},
		{"model kv heads", base + "model: {preset: llama2-70b, kv_heads: 7}\n", "job.yaml:4: model.kv_heads: 7 kv heads do not divide 64 heads"},
		{"model batch missing", base + "model: {layers: 2, hidden: 64, heads: 4, seq_len: 8, vocab: 10}\n", "job.yaml:4: model.global_batch: required without a preset"},
		{"micro batch", base + "model: {preset: gpt3-175b, micro_batch: 7}\n", "job.yaml:4: model.micro_batch: 7 does not divide global_batch 1536"},
		{"precision", base + "model: {preset: gpt3-175b, precision: fp4}\n", `job.yaml:4: model.precision: "fp4": use bf16, fp16 or fp8`},
		{"fp8 on a100", base + "gpu_model: a100-80gb\nmodel: {preset: gpt3-175b, precision: fp8}\n", "job.yaml:5: model.precision: fp8 needs FP8 tensor cores, which a100-80gb lacks"},
		{"zero stage", base + "model: {preset: gpt3-175b, zero_stage: 4}\n", "job.yaml:4: model.zero_stage: 4: use 0, 1, 2 or 3"},
		{"recompute", base + "model: {preset: gpt3-175b, recompute: most}\n", `job.yaml:4: model.recompute: "most": use none, selective or full`},
		{"stack", base + "model: {preset: gpt3-175b, stack: megatron-2019}\n",
			`job.yaml:4: model.stack: "megatron-2019" is not a known training stack: use one of megatron-2021, megatron-core, megatron-core-2024, nemo-2024, llama3-2024, deepspeed-zero (default megatron-core)`},
		{"stack known", base + "model: {preset: gpt3-175b, stack: megatron-core-2024}\n", ""},
		{"plan tp beyond node", base + "plan:\n  tp: 16\n  pp: 4\n", "job.yaml:5: plan.tp: 16 exceeds the 8 GPUs of one node (tensor parallelism stays inside a node)"},
		{"plan tp zero", base + "plan:\n  tp: 0\n  pp: 4\n", "job.yaml:5: plan.tp: 0: must be a positive whole number"},
		{"plan tp not dividing node", base + "plan:\n  tp: 3\n  pp: 4\n", "job.yaml:5: plan.tp: 3 does not divide the 8 GPUs of a node"},
		{"plan product", base + "plan: {tp: 8, pp: 4, dp: 4}\n", "job.yaml:4: plan: tp 8 × pp 4 × dp 4 = 128 GPUs, but the job asks for 64"},
		{"plan pp not dividing gpus", base + "plan: {tp: 8, pp: 3}\n", "job.yaml:4: plan.pp: tp 8 × pp 3 does not divide the job's 64 GPUs"},
		{"plan interleave without pipeline", base + "plan: {tp: 8, pp: 1, virtual_stages: 2}\n", "job.yaml:4: plan.virtual_stages: 2 needs pp of at least 2"},
		{"plan heads", base + "model: {layers: 8, hidden: 768, heads: 12, seq_len: 8, vocab: 10, global_batch: 64}\nplan: {tp: 8, pp: 1}\n", "job.yaml:5: plan.tp: 8 does not divide the model's 12 heads"},
		{"plan kv heads", "name: a\ncommand: [x]\ngpus: 8\nmodel: {layers: 8, hidden: 1024, heads: 16, kv_heads: 4, seq_len: 8, vocab: 10, global_batch: 64}\nplan: {tp: 8, pp: 1}\n", "job.yaml:5: plan.tp: 8 does not divide the model's 4 kv heads"},
		{"plan chunks", base + "model: {preset: gpt3-175b}\nplan: {tp: 8, pp: 8, virtual_stages: 13}\n", "job.yaml:5: plan.virtual_stages: pp 8 × virtual_stages 13 = 104 model chunks, more than the model's 96 layers plus the embedding and output layers"},
		{"plan interleave micro-batches", base + "model: {preset: gpt3-175b, micro_batch: 128}\nplan: {tp: 8, pp: 4, virtual_stages: 2}\n", "job.yaml:5: plan.virtual_stages: 2 needs the micro-batches per step (6) to be a multiple of pp 4"},
		{"plan cp sequence", base + "model: {preset: llama2-70b, seq_len: 4100}\nplan: {tp: 8, cp: 4, pp: 2}\n", "job.yaml:5: plan.cp: 4 needs the sequence length 4100 to split into 2×4 chunks"},
		{"plan cp product", base + "plan: {tp: 8, cp: 2, pp: 2, dp: 4}\n", "job.yaml:4: plan: tp 8 × cp 2 × pp 2 × dp 4 = 128 GPUs, but the job asks for 64"},
		{"plan cp elastic", base + "restart_policy: shrink\nelastic: {data_parallel: [1, 2]}\nplan: {tp: 8, cp: 2, pp: 2}\n", "job.yaml:6: plan.cp: 2 with elastic: an elastic job resizes data parallelism alone"},
		{"plan cp negative", base + "plan: {tp: 8, cp: -2, pp: 2}\n", "job.yaml:4: plan.cp: -2: must be a positive whole number"},
		{"plan pp beyond layers", "name: a\ncommand: [x]\ngpus: 256\nmodel: {preset: gpt3-175b}\nplan: {tp: 1, pp: 128}\n", "job.yaml:5: plan.pp: 128 exceeds the model's 96 layers"},
		{"plan batch", base + "model: {preset: gpt3-175b, global_batch: 100, micro_batch: 4}\nplan: {tp: 1, pp: 8}\n", "job.yaml:4: model.global_batch: 100 is not divisible by dp 8 × micro_batch 4"},
		{"plan micro batches", base + "model: {preset: gpt3-175b, micro_batch: 1}\nplan: {tp: 8, pp: 4, micro_batches: 7}\n", "job.yaml:5: plan.micro_batches: 7 × dp 2 × micro_batch 1 = 14, not global_batch 1536"},
		{"plan micro batches no size", base + "model: {preset: gpt3-175b}\nplan: {tp: 8, pp: 4, micro_batches: 7}\n", "job.yaml:5: plan.micro_batches: 7 × dp 2 does not divide global_batch 1536"},
		{"checkpoint negative", base + "checkpoint: {interval: -1m, dir: /c}\n", "job.yaml:4: checkpoint.interval: -1m0s is negative"},
		{"checkpoint tiny", base + "checkpoint: {interval: 1ms, dir: /c}\n", "job.yaml:4: checkpoint.interval: 1ms is under a second"},
		{"checkpoint no dir", base + "checkpoint:\n  interval: 1h\n", "job.yaml:4: checkpoint.dir: required when checkpoint.interval is set"},
		{"checkpoint relative dir", base + "checkpoint:\n  dir: ckpt\n", `job.yaml:5: checkpoint.dir: "ckpt" is not an absolute path`},
		{"stall negative", base + "stall_threshold: -5s\n", "job.yaml:4: stall_threshold: -5s is negative"},
		{"stall tiny", base + "stall_threshold: 10ms\n", "job.yaml:4: stall_threshold: 10ms is under a second"},
		{"stall recovery", base + "stall_recovery: sometimes\n", `job.yaml:4: stall_recovery: "sometimes": use manual or auto`},
		{"stall recovery without restarts", base + "restart_policy: none\nstall_recovery: auto\n", "job.yaml:5: stall_recovery: auto contradicts restart_policy none"},
		{"slow recovery", base + "slow_recovery: manual\n", `job.yaml:4: slow_recovery: "manual": use alert or auto`},
		{"slow recovery in place", base + "slow_recovery: auto\n", "job.yaml:4: slow_recovery: auto needs restart_policy replace-node or shrink"},
		{"restart policy", base + "restart_policy: pray\n", `job.yaml:4: restart_policy: "pray": use one of restart-in-place, replace-node, shrink, none`},
		{"max restarts negative", base + "max_restarts: -1\n", "job.yaml:4: max_restarts: -1 is negative"},
		{"max restarts with none", base + "restart_policy: none\nmax_restarts: 2\n", "job.yaml:5: max_restarts: 2 contradicts restart_policy none"},
		{"shrink without elastic", base + "restart_policy: shrink\n", "job.yaml:4: restart_policy: shrink needs elastic.data_parallel"},
		{"elastic empty", base + "elastic: {data_parallel: []}\n", "job.yaml:4: elastic.data_parallel: required in elastic"},
		{"elastic non-positive", base + "elastic:\n  data_parallel: [4, 0]\n", "job.yaml:5: elastic.data_parallel[1]: 0 is not a positive data-parallel size"},
		{"elastic duplicate", base + "elastic:\n  data_parallel: [4, 4]\n", "job.yaml:5: elastic.data_parallel[1]: 4 is listed twice"},
		{"elastic batch", base + "model: {preset: gpt3-175b}\nelastic:\n  data_parallel: [7]\n", "job.yaml:6: elastic.data_parallel[0]: 7 does not divide global_batch 1536"},
		{"elastic excludes plan dp", base + "plan: {tp: 8, pp: 4}\nelastic:\n  data_parallel: [1]\n", "job.yaml:6: elastic.data_parallel: does not include the plan's dp 2"},
		{"estimated runtime", base + "estimated_runtime: -1h\n", "job.yaml:4: estimated_runtime: -1h0m0s is negative"},
		{"deferrable without until", base + "estimated_runtime: 1h\ndeferrable: {}\n", "job.yaml:5: deferrable.until: required in deferrable"},
		{"deferrable until garbage", base + "estimated_runtime: 1h\ndeferrable: {until: tomorrow}\n", `job.yaml:5: deferrable.until: "tomorrow" is neither an RFC 3339 time`},
		{"deferrable until negative", base + "estimated_runtime: 1h\ndeferrable: {until: -2h}\n", "job.yaml:5: deferrable.until: -2h is not after submission"},
		{"deferrable without estimate", base + "deferrable: {until: 24h}\n", "job.yaml:4: deferrable: needs estimated_runtime"},
		{"deferrable too short", base + "estimated_runtime: 3h\ndeferrable:\n  until: 2h\n", "job.yaml:6: deferrable.until: 2h is shorter than estimated_runtime 3h0m0s"},
		{"unknown field", base + "gpu_count: 8\n", "job.yaml:4: gpu_count: unknown field; known fields are"},
		{"typo", base + "model:\n  hiden: 5\n", "job.yaml:5: model.hiden: unknown field (did you mean hidden?)"},
		{"wrong type", base + "priority: high\n", "job.yaml:4: priority: cannot unmarshal !!str `high` into int"},
		{"duration as int", base + "stall_threshold: 30\n", "job.yaml:4: stall_threshold: cannot unmarshal !!int `30` into time.Duration"},
		{"not a mapping", "- a\n- b\n", "job.yaml:1: a job file is a mapping of fields"},
		{"two documents", base + "---\nname: b\n", "job.yaml:4: more than one YAML document"},
		{"empty", "", "job.yaml: empty job file"},
		{"syntax", "name: [\n", "job.yaml:1: did not find expected node content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("job.yaml", []byte(tt.yaml))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("unexpected error:\n%v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted; want %q", tt.want)
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("error %T is not a *ValidationError", err)
			}
			first, _, _ := strings.Cut(err.Error(), "\n")
			if !strings.HasPrefix(first, tt.want) {
				t.Fatalf("error:\n  %s\nwant prefix:\n  %s", err, tt.want)
			}
		})
	}
}

func TestAllProblemsReported(t *testing.T) {
	_, err := Parse("job.yaml", []byte("name: BAD\ncommand: [x]\ngpus: 8\npriority: 9999\nrestart_policy: maybe\n"))
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 3 {
		t.Fatalf("want 3 problems, got %v", err)
	}
}

func TestFromFlags(t *testing.T) {
	s, err := FromFlags(Flags{Name: "sft", GPUs: 16, Model: "llama2-70b", TP: 8, Env: []string{"A=b=c"}, Command: []string{"python", "sft.py"}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Env["A"] != "b=c" || s.Plan.PP != 1 || s.TotalGPUs() != 16 || s.Model.Preset != "llama2-70b" {
		t.Fatalf("FromFlags built %+v", s)
	}
	if p, _ := s.FixedPlan(); p.DP != 2 {
		t.Fatalf("derived dp %d, want 2", p.DP)
	}

	tests := []struct {
		name string
		f    Flags
		want string
	}{
		{"tp beyond node", Flags{Name: "a", GPUs: 32, TP: 16, Command: []string{"x"}}, "--tp: 16 exceeds the 8 GPUs of one node"},
		{"no command", Flags{Name: "a", GPUs: 8}, "command after --: required"},
		{"bad env", Flags{Name: "a", GPUs: 8, Command: []string{"x"}, Env: []string{"NOEQUALS"}}, `--env: "NOEQUALS" is not KEY=VALUE`},
		{"reserved env", Flags{Name: "a", GPUs: 8, Command: []string{"x"}, Env: []string{"RANK=1"}}, "--env RANK: set by gpuctl"},
		{"gpu", Flags{Name: "a", GPUs: 8, Command: []string{"x"}, GPUModel: "tpu"}, `--gpu: unknown gpu "tpu"`},
		{"elastic", Flags{Name: "a", GPUs: 8, Command: []string{"x"}, ElasticDataParallel: []int{0}}, "--elastic-dp: 0 is not a positive"},
		{"max restarts", Flags{Name: "a", GPUs: 8, Command: []string{"x"}, MaxRestarts: -2, MaxRestartsSet: true}, "--max-restarts: -2 is negative"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := FromFlags(tt.f)
			if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
				t.Fatalf("error %v, want prefix %q", err, tt.want)
			}
		})
	}
}

func TestParseFileErrors(t *testing.T) {
	if _, err := ParseFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil || !strings.Contains(err.Error(), "open job file") {
		t.Fatalf("missing file: %v", err)
	}
	big := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(big, []byte("name: a\n"+strings.Repeat("# pad\n", maxSpecBytes/6+10)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseFile(big); err == nil || !strings.Contains(err.Error(), "over") {
		t.Fatalf("oversized file: %v", err)
	}
}

// TestAliasProblemsAtTheUse: a value that reaches a field through an
// alias is wrong where it is used, so that is the line named, not the
// anchor's.
func TestAliasProblemsAtTheUse(t *testing.T) {
	tests := []struct{ name, yaml, want string }{
		{"unknown field through an alias", "name: a\ngpus: 8\ncommand: [x]\nenv: &e\n  X: a\ncheckpoint: *e\n",
			"job.yaml:6: checkpoint.X: unknown field"},
		{"wrong type through an alias", "name: a\ngpus: 8\ncommand: &c [x]\nenv:\n  X: a\npriority: *c\n",
			"job.yaml:6: priority: cannot unmarshal !!seq into int"},
		{"nested value through an alias", "name: a\ngpus: 8\ncommand: [x, &v 'a b']\ncheckpoint:\n  dir: x\n  interval: *v\n",
			"job.yaml:6: checkpoint.interval: cannot unmarshal !!str `a b` into time.Duration"},
		{"the anchor's own problem stays there", "name: &n Bad_Name\ngpus: 8\ncommand: [x]\ntenant: *n\n",
			"job.yaml:1: name: \"Bad_Name\" is not a DNS label"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("job.yaml", []byte(tc.yaml))
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to start with %q", err, tc.want)
			}
		})
	}
	// The alias of the last problem names its own line too.
	_, err := Parse("job.yaml", []byte(tests[3].yaml))
	if !strings.Contains(err.Error(), "\njob.yaml:4: tenant: ") {
		t.Errorf("the alias's problem is not at its line:\n%v", err)
	}
}

// TestAliasBombRefused: aliases of aliases that would expand to billions
// of values are refused at once, with the line.
func TestAliasBombRefused(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: a\ngpus: 8\nenv:\n  A0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "  A%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	b.WriteString("command: *a9\n")
	start := time.Now()
	_, err := Parse("job.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "aliases expand to more than") {
		t.Fatalf("error %v, want the aliases refused", err)
	}
	if !regexp.MustCompile(`^job\.yaml:\d+: `).MatchString(err.Error()) {
		t.Errorf("error %q names no line", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("refused after %s", d)
	}
}

func TestDeadline(t *testing.T) {
	submit := time.Date(2026, 12, 4, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct{ until, want string }{
		{"24h", "2026-12-05T09:00:00Z"},
		{"2026-12-05T06:00:00+01:00", "2026-12-05T05:00:00Z"},
	} {
		s, err := Parse("job.yaml", []byte(base+"estimated_runtime: 1h\ndeferrable: {until: \""+tc.until+"\"}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := s.Deadline(submit).UTC().Format(time.RFC3339); got != tc.want {
			t.Errorf("until %s: deadline %s; want %s", tc.until, got, tc.want)
		}
	}
	s, err := Parse("job.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Deadline(submit).IsZero() {
		t.Error("a job that is not deferrable has a deadline")
	}
}

func TestModels(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want []string
	}{
		{Spec{}, nil},
		{Spec{GPUModel: "a100"}, []string{"a100-80gb"}},
		{Spec{GPUModels: []string{"h100-sxm", "a100"}}, []string{"h100", "a100-80gb"}},
	} {
		if got := tc.spec.Models(); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: Models() = %v, want %v", tc.spec, got, tc.want)
		}
	}
}
