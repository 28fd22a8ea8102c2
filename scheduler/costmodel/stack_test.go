package costmodel

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestDefaultStackIsTheDefaultTunables: the tunables nothing names are
// exactly the default stack's, and every stack sets its overlap terms
// and nothing else.
func TestDefaultStackIsTheDefaultTunables(t *testing.T) {
	def := DefaultTunables()
	s, err := LookupStack("")
	if err != nil || s.Name != DefaultStack {
		t.Fatalf(`LookupStack("") = %q, %v; want %s`, s.Name, err, DefaultStack)
	}
	applied := def
	s.Apply(&applied)
	if applied != def {
		t.Errorf("DefaultTunables differ from the %s stack's: %+v vs %+v", DefaultStack, def, applied)
	}
	for _, st := range Stacks() {
		tu := def
		tu.Efficiency, tu.ReservedBytes = 0.8, 3*gib
		if err := tu.ApplyStack(st.Name); err != nil {
			t.Fatal(err)
		}
		if tu.Efficiency != 0.8 || tu.ReservedBytes != 3*gib || tu.ZeRO3Overlap != def.ZeRO3Overlap {
			t.Errorf("stack %s changed a tunable that is not its own", st.Name)
		}
		if err := tu.Validate(); err != nil {
			t.Errorf("stack %s: %v", st.Name, err)
		}
		if st.Doc == "" || st.Typical == "" {
			t.Errorf("stack %s is undocumented", st.Name)
		}
	}
}

func TestUnknownStackNamesTheKnownOnes(t *testing.T) {
	_, err := LookupStack("megatron-2019")
	if err == nil || !strings.Contains(err.Error(), "megatron-core-2024") || !strings.Contains(err.Error(), `"megatron-2019"`) {
		t.Fatalf("unknown stack: %v", err)
	}
	tr := Training{GlobalBatch: 8, Stack: "megatron-2019"}
	if err := tr.Validate(); err == nil {
		t.Fatalf("Training.Validate accepts an unknown stack")
	}
}

// TestOverlapTerms: every overlap is a term of its own in the evaluation,
// each exposing the share of its communication its tunable does not hide,
// and a stack that overlaps more is no slower on the same plan.
func TestOverlapTerms(t *testing.T) {
	m, tr, err := LookupModel("gpt3-175b")
	if err != nil {
		t.Fatal(err)
	}
	hw, _ := LookupHardware("h100")
	plan := Plan{TP: 8, PP: 8, DP: 16, MicroBatch: 1, VirtualStages: 2}
	eval := func(stack string, sets ...string) Evaluation {
		t.Helper()
		tu := DefaultTunables()
		if err := tu.ApplyStack(stack); err != nil {
			t.Fatal(err)
		}
		for _, kv := range sets {
			k, v, _ := strings.Cut(kv, "=")
			if err := tu.Set(k, v); err != nil {
				t.Fatal(err)
			}
		}
		tr := tr
		tr.Stack = stack
		ev, err := Config{Model: m, Hardware: hw, Training: tr, Tunables: tu}.Evaluate(plan)
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	terms := func(ev Evaluation) map[string]Overlap {
		out := map[string]Overlap{}
		for _, o := range ev.Overlaps {
			out[o.Term] = o
		}
		return out
	}
	old, cur := eval("megatron-2021"), eval("megatron-core-2024")
	want := []string{"tp_overlap", "cp_overlap", "pp_overlap", "dp_grad_overlap", "dp_param_overlap", "zero3_overlap"}
	if len(old.Overlaps) != len(want) {
		t.Fatalf("overlaps %+v, want the terms %v", old.Overlaps, want)
	}
	for i, o := range old.Overlaps {
		if o.Term != want[i] {
			t.Errorf("overlap %d is %s, want %s", i, o.Term, want[i])
		}
	}
	ot, ct := terms(old), terms(cur)
	if o := ot["tp_overlap"]; o.CommSec <= 0 || o.ExposedFraction != 1 || o.Hidden != 0 {
		t.Errorf("megatron-2021 tp term %+v: all tensor-parallel communication exposed", o)
	}
	if o := ct["tp_overlap"]; o.ExposedSec != 0 || o.Hidden != 1 {
		t.Errorf("megatron-core-2024 tp term %+v: all hidden", o)
	}
	if o := ct["pp_overlap"]; o.CommSec <= 0 || o.ExposedSec != 0 {
		t.Errorf("megatron-core-2024 pp term %+v: all hidden", o)
	}
	if o := ot["dp_param_overlap"]; o.CommSec <= 0 || o.ExposedFraction != 1 {
		t.Errorf("megatron-2021 dp-param term %+v: ZeRO-1's gather left exposed", o)
	}
	if cur.StepSeconds >= old.StepSeconds {
		t.Errorf("megatron-core-2024 step %.3fs is not faster than megatron-2021's %.3fs", cur.StepSeconds, old.StepSeconds)
	}
	// --set moves one term of a stack and leaves the others.
	half := terms(eval("megatron-2021", "tp_overlap=0.5"))
	if o := half["tp_overlap"]; math.Abs(o.ExposedFraction-0.5) > 1e-9 || half["pp_overlap"].ExposedFraction != 1 {
		t.Errorf("tp_overlap=0.5 on megatron-2021: %+v", half)
	}
	// The sums the table shows are the terms' sums.
	if d := old.DPExposedSec - ot["dp_grad_overlap"].ExposedSec - ot["dp_param_overlap"].ExposedSec; math.Abs(d) > 1e-12 {
		t.Errorf("dp exposed %.6f is not grad + param", old.DPExposedSec)
	}
}

// TestCalibrationKeepsTheStack: calibrating under a stack moves a scale,
// says which and under which stack, and leaves every overlap term as the
// stack set it.
func TestCalibrationKeepsTheStack(t *testing.T) {
	m, tr, _ := LookupModel("llama2-70b")
	hw, _ := LookupHardware("h100")
	tu := DefaultTunables()
	if err := tu.ApplyStack("megatron-core-2024"); err != nil {
		t.Fatal(err)
	}
	tr.Stack = "megatron-core-2024"
	c := Config{Model: m, Hardware: hw, Training: tr, Tunables: tu}
	p := Plan{TP: 8, PP: 2, DP: 4, MicroBatch: 1}
	ev, err := c.Evaluate(p)
	if err != nil {
		t.Fatal(err)
	}
	cal, err := c.CalibrateReport(p, ev.StepSeconds*1.2)
	if err != nil {
		t.Fatal(err)
	}
	if cal.Term != TermCompute || cal.Stack != "megatron-core-2024" || cal.To >= cal.From {
		t.Errorf("calibration %+v: want compute_scale lowered under megatron-core-2024", cal)
	}
	after := c.Tunables
	after.Efficiency = tu.Efficiency
	if after != tu {
		t.Errorf("calibration moved more than compute_scale: %+v", c.Tunables)
	}
	got, _ := c.Evaluate(p)
	if math.Abs(got.StepSeconds/(ev.StepSeconds*1.2)-1) > 1e-6 {
		t.Errorf("calibrated step %.4fs, measured %.4fs", got.StepSeconds, ev.StepSeconds*1.2)
	}
}

// TestStacksTableIsCurrent: docs/costmodel.md's table of stacks is
// rendered from the stacks themselves (refresh with -update).
func TestStacksTableIsCurrent(t *testing.T) {
	var b strings.Builder
	b.WriteString("| stack | tp_overlap | cp_overlap | pp_overlap | dp_grad_overlap | dp_param_overlap | grad_bytes_per_param | stack_compute_scale | what it is | typical settings it leaves to the job |\n")
	b.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |\n")
	for _, s := range Stacks() {
		name := "`" + s.Name + "`"
		if s.Name == DefaultStack {
			name += " (default)"
		}
		fmt.Fprintf(&b, "| %s | %g | %g | %g | %g | %g | %g | %.4g | %s | %s |\n", name, s.TPOverlap, s.CPOverlap, s.PPOverlap,
			s.DPGradOverlap, s.DPParamOverlap, s.GradBytes, s.ComputeScale(), s.Doc, s.Typical)
	}
	docSection(t, "stacks", b.String(), "TestStacksTableIsCurrent")
}

// TestStackComputeScale: a stack's software generation scales the
// kernels, apart from the calibrated compute_scale, which calibration
// moves from 1 under any stack.
func TestStackComputeScale(t *testing.T) {
	p := Plan{TP: 8, PP: 8, DP: 2, MicroBatch: 1, VirtualStages: 12}
	c := config(t, "gpt3-175b", "h100")
	c.Training.GlobalBatch = 32
	if err := c.Tunables.ApplyStack("megatron-core-2024"); err != nil {
		t.Fatal(err)
	}
	old := mustEval(t, c, p)
	nemo := c
	if err := nemo.Tunables.ApplyStack("nemo-2024"); err != nil {
		t.Fatal(err)
	}
	s, _ := LookupStack("nemo-2024")
	if nemo.Tunables.StackComputeScale != s.ComputeScale() || s.ComputeScale() <= 1 || nemo.Tunables.Efficiency != 1 {
		t.Fatalf("nemo-2024 tunables: stack_compute_scale %g (stack %g), compute_scale %g", nemo.Tunables.StackComputeScale, s.ComputeScale(), nemo.Tunables.Efficiency)
	}
	fast := mustEval(t, nemo, p)
	if fast.ComputeSec >= old.ComputeSec || !near(old.GEMMSec/fast.GEMMSec, s.ComputeScale(), 0.02) {
		t.Errorf("GEMMs %.3f s under nemo-2024, %.3f s under megatron-core-2024: want ×%.3f", fast.GEMMSec, old.GEMMSec, s.ComputeScale())
	}
	cal, err := nemo.CalibrateReport(p, fast.StepSeconds*1.1)
	if err != nil || cal.Term != TermCompute || cal.From != 1 || nemo.Tunables.StackComputeScale != s.ComputeScale() {
		t.Errorf("calibration under nemo-2024: %+v, %v; stack_compute_scale %g", cal, err, nemo.Tunables.StackComputeScale)
	}
	back := nemo
	if err := back.Tunables.ApplyStack("megatron-core"); err != nil || back.Tunables.StackComputeScale != 1 {
		t.Errorf("megatron-core after nemo-2024: stack_compute_scale %g, %v", back.Tunables.StackComputeScale, err)
	}
}
