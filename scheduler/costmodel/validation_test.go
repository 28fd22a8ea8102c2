package costmodel

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var (
	update = flag.Bool("update", false, "rewrite the validation table in docs/costmodel.md")
	refit  = flag.Bool("fit", false, "fit the kernel parameters to the fit rows and print them")
)

// validationRow is one published measurement and the run's configuration.
type validationRow struct {
	ID string `json:"id"`
	// SourceKey groups the rows of one publication: leave-one-source-out
	// validation holds out all of a source's rows at once.
	SourceKey    string   `json:"source_key"`
	Family       string   `json:"family"`
	Source       string   `json:"source"`
	ConfigSource string   `json:"config_source,omitempty"`
	GPU          string   `json:"gpu"`
	GPUs         int      `json:"gpus"`
	Model        Model    `json:"model"`
	Training     Training `json:"training"`
	Plan         Plan     `json:"plan"`
	// Tunables are settings beyond the row's training stack
	// (Training.Stack), which sets the overlaps; rows name a stack and
	// set no overlap by hand.
	Tunables json.RawMessage `json:"tunables,omitempty"`
	// Metric is what Published measures: hardware_tflops_per_gpu
	// (recomputation counted, Megatron-LM's convention),
	// model_tflops_per_gpu (MFU × peak), step_seconds or
	// tokens_per_second_per_gpu.
	Metric      string  `json:"metric"`
	Published   float64 `json:"published"`
	Fit         bool    `json:"fit"`
	Assumptions string  `json:"assumptions"`
}

func loadValidation(t testing.TB) []validationRow {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "validation.json"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Rows []validationRow `json:"rows"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("testdata/validation.json: %v", err)
	}
	return doc.Rows
}

// config is the row's run as the cost model sees it.
func (r validationRow) config() (Config, error) {
	hw, err := LookupHardware(r.GPU)
	if err != nil {
		return Config{}, err
	}
	tu := DefaultTunables()
	if err := tu.ApplyStack(r.Training.Stack); err != nil {
		return Config{}, fmt.Errorf("%s: %w", r.ID, err)
	}
	if len(r.Tunables) > 0 {
		if err := json.Unmarshal(r.Tunables, &tu); err != nil {
			return Config{}, fmt.Errorf("%s: tunables: %w", r.ID, err)
		}
	}
	return Config{Model: r.Model, Hardware: hw, Training: r.Training, Tunables: tu}, nil
}

// predict returns the model's figure for the row's metric, and the
// evaluation it comes from.
func (r validationRow) predict() (float64, Evaluation, error) {
	c, err := r.config()
	if err != nil {
		return 0, Evaluation{}, err
	}
	if r.Plan.GPUs() != r.GPUs {
		return 0, Evaluation{}, fmt.Errorf("%s: plan %s uses %d GPUs, the row says %d", r.ID, r.Plan, r.Plan.GPUs(), r.GPUs)
	}
	ev, err := c.Evaluate(r.Plan)
	if err != nil {
		return 0, ev, fmt.Errorf("%s: %w", r.ID, err)
	}
	switch r.Metric {
	case "hardware_tflops_per_gpu":
		return ev.TFLOPSPerGPU, ev, nil
	case "model_tflops_per_gpu":
		return ev.MFU * c.peakFLOPs() / 1e12, ev, nil
	case "step_seconds":
		return ev.StepSeconds, ev, nil
	case "tokens_per_second_per_gpu":
		return ev.TokensPerSec / float64(r.GPUs), ev, nil
	}
	return 0, ev, fmt.Errorf("%s: unknown metric %q", r.ID, r.Metric)
}

// maxValidationError is the largest fit error any row may have (the
// committed parameters, fitted to the fit rows); maxLOSOError the largest
// leave-one-source-out error, its own source unseen by the fit;
// validationGoal what both aim at.
const (
	maxValidationError = 0.10
	maxLOSOError       = 0.15
	validationGoal     = 0.10
)

// knownLOSOMisses are the rows whose leave-one-source-out error passes
// maxLOSOError, each with the reason; the test checks they still do, so a
// change that brings one within bounds is noticed.
var knownLOSOMisses = map[string]string{}

func init() {
	zero3 := "the only ZeRO-3 runs: held out, ZeRO-3's three fitted terms stay at the prior (efficiency 0.5, overlap 0.5, latency 0.1 ms)"
	for _, id := range []string{"sc21-t2-zero3-175b-384", "sc21-t2-zero3-175b-768", "sc21-t2-zero3-175b-1536",
		"sc21-t2-zero3-530b-640", "sc21-t2-zero3-530b-1120", "sc21-t2-zero3-530b-2240"} {
		knownLOSOMisses[id] = zero3
	}
}

func TestValidationTable(t *testing.T) {
	rows := loadValidation(t)
	loso := leaveOneSourceOut(rows)
	gpus := map[string]bool{}
	families := map[string]bool{}
	var zero3, small, large bool
	for _, r := range rows {
		t.Run(r.ID, func(t *testing.T) {
			if r.Source == "" || r.Published <= 0 || r.SourceKey == "" {
				t.Fatalf("row lacks a source, its source key or a published figure")
			}
			if r.Training.Stack == "" {
				t.Fatalf("row names no training stack: give training.stack (%s)", strings.Join(StackNames(), ", "))
			}
			if strings.Contains(string(r.Tunables), "overlap") {
				t.Fatalf("row sets an overlap by hand (%s): its training stack sets them", r.Tunables)
			}
			pred, _, err := r.predict()
			if err != nil {
				t.Fatal(err)
			}
			if e := pred/r.Published - 1; math.Abs(e) > maxValidationError {
				t.Errorf("predicted %.4g, published %.4g: fit error %+.1f%% beyond ±%.0f%% (goal ±%.0f%%)", pred, r.Published, e*100,
					maxValidationError*100, validationGoal*100)
			}
			e := loso[r.ID]
			miss, known := knownLOSOMisses[r.ID]
			switch {
			case math.Abs(e) > maxLOSOError && !known:
				t.Errorf("leave-one-source-out error %+.1f%% beyond ±%.0f%% (goal ±%.0f%%)", e*100, maxLOSOError*100, validationGoal*100)
			case math.Abs(e) <= maxLOSOError && known:
				t.Errorf("leave-one-source-out error %+.1f%% is within ±%.0f%%, but the row is a known miss (%s): drop it from knownLOSOMisses",
					e*100, maxLOSOError*100, miss)
			}
		})
		gpus[r.GPU] = true
		families[strings.Fields(r.Family)[0]] = true
		zero3 = zero3 || r.Training.ZeROStage == 3
		small = small || r.GPUs < 100
		large = large || r.GPUs >= 1000
	}
	if !gpus["a100-80gb"] || !gpus["h100"] || len(families) < 3 || !zero3 || !small || !large {
		t.Errorf("the table must cover A100 and H100, three model families, ZeRO-3, tens and thousands of GPUs: gpus %v families %v zero3 %v", gpus, families, zero3)
	}

	docSection(t, "validation", validationMarkdown(t, rows, loso), "TestValidationTable")
}

// errorSummary is the mean and largest absolute error of some rows.
type errorSummary struct {
	n          int
	mean, most float64
}

func (s *errorSummary) add(e float64) {
	s.n++
	s.mean += (math.Abs(e) - s.mean) / float64(s.n)
	s.most = math.Max(s.most, math.Abs(e))
}

func (s errorSummary) String() string {
	return fmt.Sprintf("%d rows, mean absolute error %.1f%%, largest %.1f%%", s.n, s.mean*100, s.most*100)
}

// validationMarkdown renders the table: each row's fit error (the
// committed parameters) and leave-one-source-out error, with summaries.
func validationMarkdown(t *testing.T, rows []validationRow, loso map[string]float64) string {
	var b strings.Builder
	var fit, held, all, lo, loIn errorSummary
	type sourceErrors struct{ fit, loso errorSummary }
	bySource := map[string]*sourceErrors{}
	var sources []string
	b.WriteString("| row | source | GPUs | configuration | stack | metric | published | predicted | fit error | set | LOSO error |\n")
	b.WriteString("| --- | --- | ---: | --- | --- | --- | ---: | ---: | ---: | --- | ---: |\n")
	for _, r := range rows {
		pred, ev, err := r.predict()
		if err != nil {
			t.Fatal(err)
		}
		e := pred/r.Published - 1
		set := "held out"
		if r.Fit {
			set = "fit"
			fit.add(e)
		} else {
			held.add(e)
		}
		all.add(e)
		le := loso[r.ID]
		lo.add(le)
		if bySource[r.SourceKey] == nil {
			bySource[r.SourceKey] = &sourceErrors{}
			sources = append(sources, r.SourceKey)
		}
		bySource[r.SourceKey].fit.add(e)
		bySource[r.SourceKey].loso.add(le)
		loCell := fmt.Sprintf("%+.1f%%", le*100)
		if _, known := knownLOSOMisses[r.ID]; known {
			loCell += " (known miss)"
		} else {
			loIn.add(le)
		}
		cfg := fmt.Sprintf("%s on %s; %s; zero %d, %s recompute", r.Model.describe(), r.GPU, ev.Plan, r.Training.ZeROStage, r.Training.Recompute)
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s | %.4g | %.4g | %+.1f%% | %s | %s |\n",
			r.ID, r.Source, r.GPUs, cfg, r.Training.Stack, metricName(r.Metric), r.Published, pred, e*100, set, loCell)
	}
	fmt.Fprintf(&b, "\nFit error (bound ±%.0f%%, goal ±%.0f%%): fit rows %s; held-out rows %s; all %s.\n",
		maxValidationError*100, validationGoal*100, fit, held, all)
	fmt.Fprintf(&b, "Leave-one-source-out error (bound ±%.0f%%, goal ±%.0f%%): all %s; without the known misses %s.\n",
		maxLOSOError*100, validationGoal*100, lo, loIn)
	b.WriteString("\n| source | rows | fit error: mean, largest | leave-one-source-out error: mean, largest |\n| --- | ---: | ---: | ---: |\n")
	for _, k := range sources {
		se := bySource[k]
		fmt.Fprintf(&b, "| %s | %d | %.1f%%, %.1f%% | %.1f%%, %.1f%% |\n", k, se.fit.n, se.fit.mean*100, se.fit.most*100, se.loso.mean*100, se.loso.most*100)
	}
	fmt.Fprintf(&b, "\nKnown leave-one-source-out misses:\n\n")
	var ids []string
	for id := range knownLOSOMisses {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "- %s: %s\n", id, knownLOSOMisses[id])
	}
	return b.String()
}

func metricName(m string) string {
	switch m {
	case "hardware_tflops_per_gpu":
		return "TFLOP/s/GPU (hardware)"
	case "model_tflops_per_gpu":
		return "TFLOP/s/GPU (model)"
	case "step_seconds":
		return "s/iteration"
	case "tokens_per_second_per_gpu":
		return "tokens/s/GPU"
	}
	return m
}

// describe renders a model's shape for the table.
func (m Model) describe() string {
	s := fmt.Sprintf("%.1fB (%d×%d, %d heads", m.Params()/1e9, m.Layers, m.Hidden, m.Heads)
	if m.KVHeads > 0 {
		s += fmt.Sprintf(", %d kv", m.KVHeads)
	}
	return s + fmt.Sprintf(", seq %d)", m.SeqLen)
}

// Sections of docs/costmodel.md are delimited by
// <!-- name:begin --> and <!-- name:end --> lines.
func readSection(path, name string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(data)
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("%s has no %q section", path, name)
	}
	return s[i+len(begin) : j], nil
}

func replaceSection(path, name, body string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(data)
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i, j := strings.Index(s, begin), strings.Index(s, end)
	if i < 0 || j < i {
		return fmt.Errorf("%s has no %q section", path, name)
	}
	return os.WriteFile(path, []byte(s[:i+len(begin)]+body+s[j:]), 0o644)
}

// fitParam is one fitted value, how the search moves it, and the round
// figure the fit is drawn towards where the rows leave it free.
type fitParam struct {
	name     string
	ptr      *float64
	fraction bool // kept in (0, 1) by a logistic map; otherwise positive by exp
	prior    float64
}

// priorWeight is how strongly a fitted value is drawn to its prior, per
// squared unit of its search coordinate (log, or log-odds for a
// fraction): a value ten times off its prior costs what a 0.2% error on
// every fit row costs. Rows that depend on a value outweigh it; a value
// the rows leave free (a flat valley of the error) stays near its round
// figure instead of wandering to wherever the simplex stops.
const priorWeight = 1e-5

// coord is v on p's search coordinate.
func (p fitParam) coord(v float64) float64 {
	if p.fraction {
		v = math.Min(math.Max(v, 1e-4), 1-1e-4)
		return math.Log(v / (1 - v))
	}
	return math.Log(math.Max(v, 1e-300))
}

// penalty is the prior's part of the fit objective over ps.
func penalty(ps []fitParam) float64 {
	var sum float64
	for _, p := range ps {
		d := p.coord(*p.ptr) - p.coord(p.prior)
		sum += d * d
	}
	return priorWeight * sum
}

// fitParams are the fitted values, in the order docs/costmodel.md lists.
// Element-wise, NVLink and network efficiency are one value for both GPUs:
// fractions of memory and link bandwidth the same kernels and the same
// NCCL reach.
func fitParams() []fitParam {
	return []fitParam{
		{"a100 gemm_max_efficiency", &a100Fit.GEMMEfficiency, true, 0.7},
		{"a100 gemm_half_dim", &a100Fit.GEMMHalfDim, false, 50},
		{"a100 elementwise_efficiency", &a100Fit.ElementwiseEfficiency, true, 0.6},
		{"h100 gemm_max_efficiency", &h100Fit.GEMMEfficiency, true, 0.7},
		{"h100 gemm_half_dim", &h100Fit.GEMMHalfDim, false, 50},
		{"h100 elementwise_efficiency", &h100Fit.ElementwiseEfficiency, true, 0.6},
		{"a100 block_overhead_seconds", &a100Fit.BlockOverheadSec, false, 1e-5},
		{"h100 block_overhead_seconds", &h100Fit.BlockOverheadSec, false, 1e-5},
		{"step_overhead_seconds", &a100Fit.StepOverheadSec, false, 0.01},
		{"nvlink_efficiency", &a100Fit.NVLinkEfficiency, true, 0.9},
		{"net_efficiency", &a100Fit.NetEfficiency, true, 0.9},
		{"nemo-2024 stack_compute_scale", &fittedNeMo2024ComputeScale, false, 1},
		{"zero3_efficiency", &fittedZeRO3Efficiency, true, 0.5},
		{"zero3_overlap", &fittedZeRO3Overlap, true, 0.5},
		{"zero3_latency_seconds", &fittedZeRO3Latency, false, 1e-4},
	}
}

// constrainedBy reports whether row r's prediction depends on p.
func (p fitParam) constrainedBy(r validationRow) bool {
	switch {
	case strings.HasPrefix(p.name, "zero3"):
		return r.Training.ZeROStage == 3
	case strings.HasPrefix(p.name, "nemo-2024 "):
		return r.Training.Stack == "nemo-2024"
	case strings.HasPrefix(p.name, "a100 "):
		return strings.HasPrefix(r.GPU, "a100")
	case strings.HasPrefix(p.name, "h100 "):
		return r.GPU == "h100"
	}
	return true
}

// setShared copies the shared values to H100.
func setShared() {
	h100Fit.NVLinkEfficiency, h100Fit.NetEfficiency = a100Fit.NVLinkEfficiency, a100Fit.NetEfficiency
	h100Fit.StepOverheadSec = a100Fit.StepOverheadSec
}

// fitObjective is the mean squared log error over the fit rows.
func fitObjective(rows []validationRow) float64 {
	return fitError(rows, func(r validationRow) bool { return r.Fit }) + penalty(fitParams())
}

// fitError is the mean squared log error over the rows use picks.
func fitError(rows []validationRow, use func(validationRow) bool) float64 {
	setShared()
	var sum float64
	n := 0
	for _, r := range rows {
		if !use(r) {
			continue
		}
		pred, _, err := r.predict()
		if err != nil || pred <= 0 || math.IsNaN(pred) {
			return math.Inf(1)
		}
		l := math.Log(pred / r.Published)
		sum += l * l
		n++
	}
	return sum / float64(n)
}

// fitTo moves the fitted values from where they are to the least squared
// log error over the rows use picks (Nelder–Mead, fractions kept in (0, 1)
// by a logistic map, the rest positive by exp), leaves them there and
// returns the error.
func fitTo(rows []validationRow, use func(validationRow) bool) float64 {
	// A value no picked row depends on stays where it is: the ZeRO-3
	// terms without a ZeRO-3 row, a GPU's kernels without a row on it.
	var ps []fitParam
	for _, p := range fitParams() {
		if slices.ContainsFunc(rows, func(r validationRow) bool { return use(r) && p.constrainedBy(r) }) {
			ps = append(ps, p)
		}
	}
	fromU := func(p fitParam, u float64) float64 {
		if p.fraction {
			return 1 / (1 + math.Exp(-u))
		}
		return math.Exp(u)
	}
	x0 := make([]float64, len(ps))
	for i, p := range ps {
		x0[i] = p.coord(*p.ptr)
	}
	f := func(x []float64) float64 {
		for i, p := range ps {
			*p.ptr = fromU(p, x[i])
		}
		return fitError(rows, use) + penalty(ps)
	}
	// Restart the simplex until a restart no longer helps: the error
	// surface has long flat valleys a single run stops in.
	best, val := nelderMead(f, x0, 0.3, 4000)
	for range 20 {
		next, v := nelderMead(f, best, 0.1, 4000)
		if v >= val*(1-1e-6) {
			break
		}
		best, val = next, v
	}
	f(best)
	return val
}

// TestKernelFitsAreFitted checks the committed kernel parameters are where
// the fit puts them: moving any one by 2% either way does not lower the
// fit rows' error.
func TestKernelFitsAreFitted(t *testing.T) {
	rows := loadValidation(t)
	saved := snapshotFits()
	defer restoreFits(saved)
	base := fitObjective(rows)
	for _, p := range fitParams() {
		v := *p.ptr
		for _, f := range []float64{0.98, 1.02} {
			*p.ptr = v * f
			if p.fraction && *p.ptr > 1 {
				*p.ptr = 1
			}
			if got := fitObjective(rows); got < base*(1-1e-3) {
				t.Errorf("%s = %g: %g lowers the fit error from %.5g to %.5g; refit with go test -run TestFit -fit", p.name, v, *p.ptr, base, got)
			}
			*p.ptr = v
		}
	}
}

// TestFitsTableIsCurrent renders docs/costmodel.md's table of the fitted
// parameters from the committed values.
func TestFitsTableIsCurrent(t *testing.T) {
	num := func(v float64) string { return strconv.FormatFloat(v, 'g', 4, 64) }
	var b strings.Builder
	b.WriteString("| parameter | A100 80 GB | H100 SXM | fitted to |\n| --- | ---: | ---: | --- |\n")
	row := func(name string, a, h float64, to string) {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, num(a), num(h), to)
	}
	row("gemm_max_efficiency", a100Fit.GEMMEfficiency, h100Fit.GEMMEfficiency, "per GPU: its fit rows")
	row("gemm_half_dim", a100Fit.GEMMHalfDim, h100Fit.GEMMHalfDim, "per GPU: its fit rows")
	fmt.Fprintf(&b, "| `fp8_gemm_max_efficiency` | | %s | not fitted: `gemm_max_efficiency` × %.3f, FlashAttention-3's fraction of the FP8 peak over its fraction of the bf16 peak on H100 (Shah et al. 2024: close to 1.2 PFLOP/s FP8, 740 TFLOP/s bf16) |\n",
		num(h100Fit.GEMMEfficiency*fp8GEMMRatio), fp8GEMMRatio)
	row("flash_attention_efficiency", a100Fit.FlashAttentionEfficiency, h100Fit.FlashAttentionEfficiency,
		"not fitted: A100 the low end of FlashAttention-2's 50–73% on A100 (Dao 2023); H100 the low end of FlashAttention-3, "+
			"1.5 × FlashAttention-2's 35% on H100 (Shah et al. 2024)")
	row("elementwise_efficiency", a100Fit.ElementwiseEfficiency, h100Fit.ElementwiseEfficiency, "per GPU: its fit rows")
	row("block_overhead_seconds", a100Fit.BlockOverheadSec, h100Fit.BlockOverheadSec, "per GPU: its fit rows")
	row("step_overhead_seconds", a100Fit.StepOverheadSec, h100Fit.StepOverheadSec, "all fit rows (one value)")
	row("nvlink_efficiency", a100Fit.NVLinkEfficiency, h100Fit.NVLinkEfficiency, "all fit rows (one value)")
	row("net_efficiency", a100Fit.NetEfficiency, h100Fit.NetEfficiency, "all fit rows (one value)")
	for _, z := range []struct {
		name string
		v    float64
		to   string
	}{
		{"stack_compute_scale` of `nemo-2024", fittedNeMo2024ComputeScale, "the nemo-2024 rows (NVIDIA's DGX Cloud Benchmarking recipes, NeMo's performance summary)"},
		{"zero3_efficiency", fittedZeRO3Efficiency, "ZeRO-3 rows (DeepSpeed ZeRO-3 on A100)"},
		{"zero3_overlap", fittedZeRO3Overlap, "ZeRO-3 rows"},
		{"zero3_latency_seconds", fittedZeRO3Latency, "ZeRO-3 rows"},
	} {
		fmt.Fprintf(&b, "| `%s` (tunable) | %s | | %s |\n", z.name, num(z.v), z.to)
	}
	docSection(t, "fits", b.String(), "TestFitsTableIsCurrent")
}

type fitSnapshot struct {
	a, h      KernelFit
	nemo      float64
	z, zo, zl float64
}

func snapshotFits() fitSnapshot {
	return fitSnapshot{a100Fit, h100Fit, fittedNeMo2024ComputeScale, fittedZeRO3Efficiency, fittedZeRO3Overlap, fittedZeRO3Latency}
}

func restoreFits(s fitSnapshot) {
	a100Fit, h100Fit, fittedNeMo2024ComputeScale = s.a, s.h, s.nemo
	fittedZeRO3Efficiency, fittedZeRO3Overlap, fittedZeRO3Latency = s.z, s.zo, s.zl
}

// TestFit fits the kernel parameters to the fit rows (Nelder–Mead on the
// mean squared log error) and prints them; with -fit only.
func TestFit(t *testing.T) {
	if !*refit {
		t.Skip("run with -fit to refit the kernel parameters")
	}
	rows := loadValidation(t)
	saved := snapshotFits()
	defer restoreFits(saved)
	val := fitTo(rows, func(r validationRow) bool { return r.Fit })
	t.Logf("objective (mean squared log error and prior) %.6g; fit rows rms %.2f%%", val, math.Sqrt(fitError(rows, func(r validationRow) bool { return r.Fit }))*100)
	for _, p := range fitParams() {
		t.Logf("%-34s %.4g", p.name, *p.ptr)
	}
	var errs []string
	for _, r := range rows {
		pred, _, _ := r.predict()
		errs = append(errs, fmt.Sprintf("%-32s fit=%-5v %+6.1f%%", r.ID, r.Fit, (pred/r.Published-1)*100))
	}
	sort.Strings(errs)
	t.Log("\n" + strings.Join(errs, "\n"))
}

// looPrior is where every leave-one-source-out fit starts: round figures,
// not the committed fit (which saw the held-out source), so a parameter
// the other sources do not constrain stays at a figure no row chose.
func looPrior() {
	for _, p := range fitParams() {
		*p.ptr = p.prior
	}
	setShared()
}

// leaveOneSourceOut predicts every row with the parameters fitted to all
// the other sources' rows (fit and held-out alike), the row's own source
// left out, and returns the error per row id.
func leaveOneSourceOut(rows []validationRow) map[string]float64 {
	saved := snapshotFits()
	defer restoreFits(saved)
	out := map[string]float64{}
	var sources []string
	for _, r := range rows {
		if !slices.Contains(sources, r.SourceKey) {
			sources = append(sources, r.SourceKey)
		}
	}
	for _, src := range sources {
		looPrior()
		fitTo(rows, func(r validationRow) bool { return r.SourceKey != src })
		setShared()
		for _, r := range rows {
			if r.SourceKey != src {
				continue
			}
			pred, _, err := r.predict()
			if err != nil {
				out[r.ID] = math.Inf(1)
				continue
			}
			out[r.ID] = pred/r.Published - 1
		}
	}
	return out
}

// nelderMead minimises f from x0 with an initial simplex of size step.
func nelderMead(f func([]float64) float64, x0 []float64, step float64, iters int) ([]float64, float64) {
	n := len(x0)
	pts := make([][]float64, n+1)
	vals := make([]float64, n+1)
	for i := range pts {
		pts[i] = append([]float64(nil), x0...)
		if i > 0 {
			pts[i][i-1] += step
		}
		vals[i] = f(pts[i])
	}
	point := func(a []float64, b []float64, t float64) []float64 {
		out := make([]float64, n)
		for i := range out {
			out[i] = a[i] + t*(b[i]-a[i])
		}
		return out
	}
	for range iters {
		idx := make([]int, n+1)
		for i := range idx {
			idx[i] = i
		}
		sort.Slice(idx, func(a, b int) bool { return vals[idx[a]] < vals[idx[b]] })
		ps, vs := make([][]float64, n+1), make([]float64, n+1)
		for i, k := range idx {
			ps[i], vs[i] = pts[k], vals[k]
		}
		pts, vals = ps, vs
		if vals[n]-vals[0] <= 1e-12*(1+math.Abs(vals[0])) {
			break
		}
		cen := make([]float64, n)
		for _, p := range pts[:n] {
			for i := range cen {
				cen[i] += p[i] / float64(n)
			}
		}
		xr := point(cen, pts[n], -1)
		fr := f(xr)
		switch {
		case fr < vals[0]:
			xe := point(cen, pts[n], -2)
			if fe := f(xe); fe < fr {
				pts[n], vals[n] = xe, fe
			} else {
				pts[n], vals[n] = xr, fr
			}
		case fr < vals[n-1]:
			pts[n], vals[n] = xr, fr
		default:
			xc := point(cen, pts[n], 0.5)
			if fc := f(xc); fc < vals[n] {
				pts[n], vals[n] = xc, fc
			} else {
				for i := 1; i <= n; i++ {
					pts[i] = point(pts[0], pts[i], 0.5)
					vals[i] = f(pts[i])
				}
			}
		}
	}
	return pts[0], vals[0]
}

// docSection checks that docs/costmodel.md's section name holds body, and
// with -update rewrites it; test names the test that renders it.
func docSection(t *testing.T, name, body, test string) {
	t.Helper()
	path := filepath.Join("..", "..", "docs", "costmodel.md")
	if *update {
		if err := replaceSection(path, name, body); err != nil {
			t.Fatal(err)
		}
	}
	got, err := readSection(path, name)
	if err != nil {
		t.Fatal(err)
	}
	if got != body {
		t.Errorf("docs/costmodel.md's %s table is stale: run go test ./scheduler/costmodel -run %s -update", name, test)
	}
}
