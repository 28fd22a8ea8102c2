package jobspec

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/scheduler/costmodel"
)

var (
	labelRE  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	envKeyRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// reservedEnv are variables the launcher sets for every rank.
var reservedEnv = []string{"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}

// Validate checks s (after ApplyDefaults) and returns a *ValidationError
// listing every problem, or nil.
func (s *Spec) Validate() error {
	if err := s.validate(nil); err != nil {
		return err
	}
	return nil
}

// checker collects problems with the line of each path.
type checker struct {
	lines map[string]int
	probs []Problem
}

// add records a problem at path; a path without a line of its own takes
// the line of its nearest parent that has one.
func (c *checker) add(path, format string, args ...any) {
	line := 0
	for p := path; p != ""; {
		if l, ok := c.lines[p]; ok {
			line = l
			break
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	c.probs = append(c.probs, Problem{Path: path, Line: line, Reason: fmt.Sprintf(format, args...)})
}

func (s *Spec) validate(lines map[string]int) *ValidationError {
	c := &checker{lines: lines}

	switch {
	case s.Name == "":
		c.add("name", "required: a short DNS-style name such as llama-70b-sft")
	case !labelRE.MatchString(s.Name):
		c.add("name", "%s is not a DNS label: use lower-case letters, digits and '-', at most 63, starting and ending alphanumeric", api.Quote(s.Name))
	}
	for path, v := range map[string]string{"tenant": s.Tenant, "queue": s.Queue} {
		if v != "" && !labelRE.MatchString(v) {
			c.add(path, "%s is not a DNS label: use lower-case letters, digits and '-'", api.Quote(v))
		}
	}
	if s.Priority < -1000 || s.Priority > 1000 {
		c.add("priority", "%d is outside -1000..1000", s.Priority)
	}
	switch {
	case len(s.Command) == 0:
		c.add("command", "required: the program each node runs, e.g. [python, train.py]")
	case strings.TrimSpace(s.Command[0]) == "":
		c.add("command[0]", "the program name is empty")
	}
	keys := make([]string, 0, len(s.Env))
	for k := range s.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch {
		case !envKeyRE.MatchString(k):
			c.add("env."+k, "not a valid environment variable name (letters, digits, '_', not starting with a digit)")
		case strings.HasPrefix(k, "GPUCTL_") || slices.Contains(reservedEnv, k):
			c.add("env."+k, "set by gpuctl for every rank; remove it from env")
		}
	}

	s.validateRunAs(c)

	if !s.checkBounds(c) {
		// Absurd sizes would overflow the arithmetic below.
		return &ValidationError{Problems: c.probs}
	}
	s.validateGPUs(c)
	m, tr, hasModel := s.validateModel(c)
	s.validatePlan(c, m, tr, hasModel)
	s.validateRecovery(c, tr, hasModel)

	if s.EstimatedRuntime < 0 {
		c.add("estimated_runtime", "%s is negative", s.EstimatedRuntime)
	}
	s.validateDeferrable(c)
	if len(c.probs) == 0 {
		return nil
	}
	return &ValidationError{Problems: c.probs}
}

// validateGPUModels checks gpu_models against gpu_model and allow_mixed.
func (s *Spec) validateGPUModels(c *checker) {
	if len(s.GPUModels) == 0 {
		return
	}
	if s.GPUModel != "" {
		c.add("gpu_models", "given with gpu_model %s: give gpu_model (one model) or gpu_models (any one of several), not both", s.GPUModel)
	}
	if s.AllowMixed {
		c.add("allow_mixed", "true contradicts gpu_models: a job on gpu_models runs on one of them at a time; drop one of the fields")
	}
	seen := map[string]string{}
	for _, n := range s.GPUModels {
		hw, err := costmodel.LookupHardware(n)
		if err != nil {
			c.add("gpu_models", "%v", err)
			continue
		}
		if first, ok := seen[hw.Name]; ok {
			c.add("gpu_models", "%s and %s are the same profile (%s): list it once", first, n, hw.Name)
			continue
		}
		seen[hw.Name] = n
	}
}

func (s *Spec) validateGPUs(c *checker) {
	node := s.NodeSize()
	if s.GPUModel != "" {
		if _, err := costmodel.LookupHardware(s.GPUModel); err != nil {
			c.add("gpu_model", "%v", err)
		} else if s.AllowMixed {
			c.add("allow_mixed", "true contradicts gpu_model %s: drop one of them", s.GPUModel)
		}
	}
	s.validateGPUModels(c)
	switch {
	case s.GPUs == 0 && s.Nodes == 0:
		c.add("gpus", "required: give gpus, or nodes and gpus_per_node")
	case s.GPUs < 0:
		c.add("gpus", "%d is not a positive GPU count", s.GPUs)
	case s.GPUs > 0 && s.Nodes != 0:
		c.add("nodes", "give gpus or nodes × gpus_per_node, not both")
	case s.Nodes < 0:
		c.add("nodes", "%d is not a positive node count", s.Nodes)
	}
	switch {
	case s.GPUsPerNode < 0:
		c.add("gpus_per_node", "%d is not a positive GPU count", s.GPUsPerNode)
	case s.GPUsPerNode > node:
		c.add("gpus_per_node", "%d exceeds the %d GPUs of one node", s.GPUsPerNode, node)
	case s.GPUs > 0 && s.GPUsPerNode > 0 && s.GPUs > s.GPUsPerNode && s.GPUs%s.GPUsPerNode != 0:
		c.add("gpus", "%d is not a whole number of nodes of %d GPUs", s.GPUs, s.GPUsPerNode)
	case s.GPUs > node && s.GPUsPerNode == 0 && s.GPUs%node != 0:
		c.add("gpus", "%d spans nodes but is not a multiple of the %d GPUs of one node: use nodes and gpus_per_node", s.GPUs, node)
	}
}

// validateModel checks the model section and returns the resolved model.
func (s *Spec) validateModel(c *checker) (costmodel.Model, costmodel.Training, bool) {
	ms := s.Model
	if ms == nil {
		return costmodel.Model{}, costmodel.Training{}, false
	}
	if ms.Preset != "" {
		if _, _, err := costmodel.LookupModel(ms.Preset); err != nil {
			c.add("model.preset", "%v", err)
			return costmodel.Model{}, costmodel.Training{}, false
		}
	}
	for _, f := range []struct {
		path string
		v    int
	}{{"layers", ms.Layers}, {"hidden", ms.Hidden}, {"heads", ms.Heads}, {"kv_heads", ms.KVHeads}, {"ffn", ms.FFN},
		{"seq_len", ms.SeqLen}, {"vocab", ms.Vocab}, {"global_batch", ms.GlobalBatch}, {"micro_batch", ms.MicroBatch}} {
		if f.v < 0 {
			c.add("model."+f.path, "%d is negative", f.v)
		}
	}
	if ms.Preset == "" {
		for _, f := range []struct {
			path string
			v    int
		}{{"layers", ms.Layers}, {"hidden", ms.Hidden}, {"heads", ms.Heads}, {"seq_len", ms.SeqLen}, {"vocab", ms.Vocab}} {
			if f.v == 0 {
				c.add("model."+f.path, "required without a preset (presets: %s)", strings.Join(costmodel.ModelNames(), ", "))
			}
		}
	}
	m, tr, _, err := s.CostModel()
	if err != nil {
		c.add("model", "%v", err)
		return m, tr, false
	}
	ok := true
	if m.Heads > 0 && m.Hidden > 0 && m.Hidden%m.Heads != 0 {
		c.add("model.heads", "%d heads do not divide hidden size %d", m.Heads, m.Hidden)
		ok = false
	}
	if m.KVHeads > 0 && m.Heads > 0 && m.Heads%m.KVHeads != 0 {
		c.add("model.kv_heads", "%d kv heads do not divide %d heads", m.KVHeads, m.Heads)
		ok = false
	}
	if tr.GlobalBatch <= 0 {
		c.add("model.global_batch", "required without a preset: sequences per optimizer step")
		ok = false
	}
	if ms.MicroBatch > 0 && tr.GlobalBatch > 0 && tr.GlobalBatch%ms.MicroBatch != 0 {
		c.add("model.micro_batch", "%d does not divide global_batch %d", ms.MicroBatch, tr.GlobalBatch)
		ok = false
	}
	switch tr.Precision {
	case costmodel.PrecisionBF16, costmodel.PrecisionFP16:
	case costmodel.PrecisionFP8:
		if hw, err := costmodel.LookupHardware(s.GPUModel); err == nil && s.GPUModel != "" && hw.PeakFP8TFLOPS == 0 {
			c.add("model.precision", "fp8 needs FP8 tensor cores, which %s lacks: use bf16", hw.Name)
			ok = false
		}
	default:
		c.add("model.precision", "%q: use bf16, fp16 or fp8", ms.Precision)
		ok = false
	}
	if tr.ZeROStage < 0 || tr.ZeROStage > 3 {
		c.add("model.zero_stage", "%d: use 0, 1, 2 or 3", tr.ZeROStage)
		ok = false
	}
	switch tr.Recompute {
	case costmodel.RecomputeNone, costmodel.RecomputeSelective, costmodel.RecomputeFull:
	default:
		c.add("model.recompute", "%q: use none, selective or full", ms.Recompute)
		ok = false
	}
	if _, err := costmodel.LookupStack(tr.Stack); err != nil {
		c.add("model.stack", "%q is not a known training stack: use one of %s (default %s)", ms.Stack,
			strings.Join(costmodel.StackNames(), ", "), costmodel.DefaultStack)
		ok = false
	}
	if ok {
		if err := m.Validate(); err != nil {
			c.add("model", "%v", err)
			ok = false
		}
	}
	return m, tr, ok
}

func (s *Spec) validatePlan(c *checker, m costmodel.Model, tr costmodel.Training, hasModel bool) {
	p := s.Plan
	if p == nil {
		return
	}
	node := s.NodeSize()
	if s.GPUsPerNode > 0 {
		node = s.GPUsPerNode
	}
	gpus := s.TotalGPUs()
	bad := false
	for _, f := range []struct {
		path string
		v    int
		need bool
	}{{"tp", p.TP, true}, {"cp", p.CP, false}, {"pp", p.PP, true}, {"dp", p.DP, false}, {"virtual_stages", p.VirtualStages, false}, {"micro_batches", p.MicroBatches, false}} {
		if f.v < 0 || (f.need && f.v == 0) {
			c.add("plan."+f.path, "%d: must be a positive whole number", f.v)
			bad = true
		}
	}
	if bad {
		return
	}
	switch {
	case p.TP > node:
		c.add("plan.tp", "%d exceeds the %d GPUs of one node (tensor parallelism stays inside a node)", p.TP, node)
		return
	case node%p.TP != 0:
		c.add("plan.tp", "%d does not divide the %d GPUs of a node: use a power of two", p.TP, node)
		return
	}
	dp, cp := p.DP, max(p.CP, 1)
	// Name cp in the sums only when the job uses it.
	tpcp := fmt.Sprintf("tp %d", p.TP)
	if cp > 1 {
		tpcp += fmt.Sprintf(" × cp %d", cp)
	}
	if gpus > 0 {
		if dp == 0 {
			if gpus%(p.TP*cp*p.PP) != 0 {
				c.add("plan.pp", "%s × pp %d does not divide the job's %d GPUs", tpcp, p.PP, gpus)
				return
			}
			dp = gpus / (p.TP * cp * p.PP)
		} else if n := p.TP * cp * p.PP * dp; n != gpus {
			c.add("plan", "%s × pp %d × dp %d = %d GPUs, but the job asks for %d", tpcp, p.PP, dp, n, gpus)
			return
		}
	}
	v := max(p.VirtualStages, 1)
	if v > 1 && p.PP < 2 {
		c.add("plan.virtual_stages", "%d needs pp of at least 2 (interleaving splits pipeline stages)", v)
	}
	if !hasModel {
		return
	}
	if m.Heads%p.TP != 0 {
		c.add("plan.tp", "%d does not divide the model's %d heads", p.TP, m.Heads)
	}
	if kv := m.KVHeads; kv > 0 && kv%p.TP != 0 {
		c.add("plan.tp", "%d does not divide the model's %d kv heads", p.TP, kv)
	}
	if cp > 1 && m.SeqLen%(2*cp) != 0 {
		c.add("plan.cp", "%d needs the sequence length %d to split into 2×%d chunks (load-balanced ring attention): use a cp that divides seq_len/2", cp, m.SeqLen, cp)
	}
	// Stages need not divide the layers: the embedding and output layers
	// then count as one layer each. Every model chunk needs one of them.
	switch {
	case p.PP > m.Layers:
		c.add("plan.pp", "%d exceeds the model's %d layers", p.PP, m.Layers)
	case p.PP*v > m.Layers+2:
		c.add("plan.virtual_stages", "pp %d × virtual_stages %d = %d model chunks, more than the model's %d layers plus the embedding and output layers", p.PP, v, p.PP*v, m.Layers)
	}
	if dp == 0 {
		return
	}
	mbs := s.Model.MicroBatch
	switch {
	case mbs > 0 && tr.GlobalBatch%(dp*mbs) != 0:
		c.add("model.global_batch", "%d is not divisible by dp %d × micro_batch %d", tr.GlobalBatch, dp, mbs)
	case mbs > 0 && p.MicroBatches > 0 && p.MicroBatches*dp*mbs != tr.GlobalBatch:
		c.add("plan.micro_batches", "%d × dp %d × micro_batch %d = %d, not global_batch %d", p.MicroBatches, dp, mbs, p.MicroBatches*dp*mbs, tr.GlobalBatch)
	case mbs == 0 && p.MicroBatches > 0 && tr.GlobalBatch%(dp*p.MicroBatches) != 0:
		c.add("plan.micro_batches", "%d × dp %d does not divide global_batch %d", p.MicroBatches, dp, tr.GlobalBatch)
	case mbs == 0 && p.MicroBatches == 0 && tr.GlobalBatch%dp != 0:
		c.add("model.global_batch", "%d is not divisible by dp %d", tr.GlobalBatch, dp)
	default:
		n := p.MicroBatches
		if n == 0 {
			n = tr.GlobalBatch / (dp * max(mbs, 1))
		}
		if v > 1 && n%p.PP != 0 {
			c.add("plan.virtual_stages", "%d needs the micro-batches per step (%d) to be a multiple of pp %d (the interleaved schedule): change micro_batch or drop virtual_stages", v, n, p.PP)
		}
	}
}

func (s *Spec) validateRecovery(c *checker, tr costmodel.Training, hasModel bool) {
	cp := s.Checkpoint
	switch {
	case cp.Interval < 0:
		c.add("checkpoint.interval", "%s is negative", cp.Interval)
	case cp.Interval > 0 && cp.Interval < time.Second:
		c.add("checkpoint.interval", "%s is under a second: no checkpoint writes that fast", cp.Interval)
	case cp.Interval > 0 && cp.Dir == "":
		c.add("checkpoint.dir", "required when checkpoint.interval is set: where ranks write step-N/")
	}
	if cp.Reshardable && cp.Dir == "" {
		c.add("checkpoint.reshardable", "needs checkpoint.dir: a job without checkpoints has nothing to reshard")
	}
	if cp.Dir != "" && !filepath.IsAbs(cp.Dir) {
		c.add("checkpoint.dir", "%q is not an absolute path", cp.Dir)
	}
	switch {
	case s.StallThreshold < 0:
		c.add("stall_threshold", "%s is negative", s.StallThreshold)
	case s.StallThreshold > 0 && s.StallThreshold < time.Second:
		c.add("stall_threshold", "%s is under a second: collectives routinely take longer", s.StallThreshold)
	}
	if !slices.Contains(RestartPolicies, s.RestartPolicy) {
		names := make([]string, len(RestartPolicies))
		for i, p := range RestartPolicies {
			names[i] = string(p)
		}
		c.add("restart_policy", "%q: use one of %s", s.RestartPolicy, strings.Join(names, ", "))
	}
	if !slices.Contains(StallRecoveries, s.StallRecovery) {
		c.add("stall_recovery", "%q: use manual or auto", s.StallRecovery)
	}
	if s.StallRecovery == StallAuto && s.RestartPolicy == NoRestart {
		c.add("stall_recovery", "auto contradicts restart_policy none: a stalled job can only be restarted")
	}
	if !slices.Contains(SlowRecoveries, s.SlowRecovery) {
		c.add("slow_recovery", "%q: use alert or auto", s.SlowRecovery)
	}
	if s.SlowRecovery == SlowAuto && s.RestartPolicy != ReplaceNode && s.RestartPolicy != Shrink {
		c.add("slow_recovery", "auto needs restart_policy replace-node or shrink: the slow node is swapped for a spare")
	}
	if s.MaxRestarts != nil {
		switch {
		case *s.MaxRestarts < 0:
			c.add("max_restarts", "%d is negative", *s.MaxRestarts)
		case *s.MaxRestarts > 0 && s.RestartPolicy == NoRestart:
			c.add("max_restarts", "%d contradicts restart_policy none: drop one", *s.MaxRestarts)
		}
	}
	if s.RestartPolicy == Shrink && (s.Elastic == nil || len(s.Elastic.DataParallel) == 0) {
		c.add("restart_policy", "shrink needs elastic.data_parallel: the data-parallel sizes the job may shrink to")
	}
	e := s.Elastic
	if e == nil {
		return
	}
	if len(e.DataParallel) == 0 {
		c.add("elastic.data_parallel", "required in elastic: the allowed data-parallel sizes")
		return
	}
	seen := map[int]bool{}
	for i, d := range e.DataParallel {
		path := fmt.Sprintf("elastic.data_parallel[%d]", i)
		dup := seen[d]
		seen[d] = true
		switch {
		case d <= 0:
			c.add(path, "%d is not a positive data-parallel size", d)
		case dup:
			c.add(path, "%d is listed twice", d)
		case hasModel && tr.GlobalBatch > 0 && tr.GlobalBatch%d != 0:
			c.add(path, "%d does not divide global_batch %d", d, tr.GlobalBatch)
		}
	}
	if s.Plan != nil && s.Plan.CP > 1 {
		// Resizing changes dp in tp × pp units; a context-parallel group
		// would be split.
		c.add("plan.cp", "%d with elastic: an elastic job resizes data parallelism alone; drop plan.cp or elastic", s.Plan.CP)
	}
	if s.Plan != nil && s.Plan.TP > 0 && s.Plan.PP > 0 {
		if p, ok := s.FixedPlan(); ok && p.DP > 0 && !slices.Contains(e.DataParallel, p.DP) {
			c.add("elastic.data_parallel", "does not include the plan's dp %d", p.DP)
		}
	}
}

// maxCount bounds every count in a job: far above any real cluster, far
// below where products of counts overflow.
const maxCount = 1 << 24

// checkBounds refuses counts no cluster or model has.
func (s *Spec) checkBounds(c *checker) bool {
	type field struct {
		path string
		v    int
	}
	fs := []field{{"gpus", s.GPUs}, {"nodes", s.Nodes}, {"gpus_per_node", s.GPUsPerNode}}
	if m := s.Model; m != nil {
		fs = append(fs, field{"model.layers", m.Layers}, field{"model.hidden", m.Hidden}, field{"model.heads", m.Heads},
			field{"model.kv_heads", m.KVHeads}, field{"model.ffn", m.FFN}, field{"model.seq_len", m.SeqLen},
			field{"model.vocab", m.Vocab}, field{"model.global_batch", m.GlobalBatch}, field{"model.micro_batch", m.MicroBatch})
		if m.ZeROStage != nil {
			fs = append(fs, field{"model.zero_stage", *m.ZeROStage})
		}
	}
	if p := s.Plan; p != nil {
		fs = append(fs, field{"plan.tp", p.TP}, field{"plan.cp", p.CP}, field{"plan.pp", p.PP}, field{"plan.dp", p.DP},
			field{"plan.virtual_stages", p.VirtualStages}, field{"plan.micro_batches", p.MicroBatches})
	}
	if s.MaxRestarts != nil {
		fs = append(fs, field{"max_restarts", *s.MaxRestarts})
	}
	if e := s.Elastic; e != nil {
		for i, d := range e.DataParallel {
			fs = append(fs, field{fmt.Sprintf("elastic.data_parallel[%d]", i), d})
		}
	}
	ok := true
	for _, f := range fs {
		if f.v > maxCount || f.v < -maxCount {
			c.add(f.path, "%d is implausibly large (the limit is %d)", f.v, maxCount)
			ok = false
		}
	}
	if s.Nodes*s.GPUsPerNode > maxCount {
		c.add("nodes", "%d nodes × %d GPUs is implausibly large", s.Nodes, s.GPUsPerNode)
		ok = false
	}
	return ok
}

func (s *Spec) validateDeferrable(c *checker) {
	d := s.Deferrable
	if d == nil {
		return
	}
	if d.Until == "" {
		c.add("deferrable.until", "required in deferrable: an RFC 3339 time or a duration from submission (24h)")
		return
	}
	_, after, rel, err := d.deadline()
	switch {
	case err != nil:
		c.add("deferrable.until", "%q is neither an RFC 3339 time (2026-12-05T06:00:00Z) nor a duration (24h)", d.Until)
	case rel && after <= 0:
		c.add("deferrable.until", "%s is not after submission; give a positive duration", d.Until)
	case s.EstimatedRuntime <= 0:
		c.add("deferrable", "needs estimated_runtime, so the scheduler knows the job still ends by until")
	case rel && after < s.EstimatedRuntime:
		c.add("deferrable.until", "%s is shorter than estimated_runtime %s; the job could not finish in time", d.Until, s.EstimatedRuntime)
	}
}
