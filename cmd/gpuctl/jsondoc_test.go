package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/scheduler/costmodel"
	"github.com/gpuctl/gpuctl/scheduler/planner"
	"github.com/gpuctl/gpuctl/scheduler/simulate"
	"github.com/spf13/cobra"
)

// jsonDocs are the -o json documents of plan and simulate, by the heading
// of their table in the README's "JSON output" section.
var jsonDocs = []struct {
	heading string
	typ     reflect.Type
}{
	{"`plan`", reflect.TypeFor[planner.Document]()},
	{"`simulate` (with `--trace`)", reflect.TypeFor[simulate.TraceDocument]()},
	{"`simulate` (with `--model`)", reflect.TypeFor[simulate.RunDocument]()},
}

var (
	tunablesType = reflect.TypeFor[costmodel.Tunables]()
	snakeCase    = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
)

// jsonPaths lists every field path a document type can emit: nested
// objects as a.b, list elements as a[].b. Tunables marshal as one object
// with a key per tunable; maps are objects keyed by data.
func jsonPaths(t reflect.Type, prefix string, out map[string]bool) {
	var order []string
	jsonPathsInOrder(t, prefix, &order)
	for _, p := range order {
		out[p] = true
	}
}

// jsonPathsInOrder appends the paths in field order.
func jsonPathsInOrder(t reflect.Type, prefix string, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == tunablesType {
		for _, n := range costmodel.TunableNames() {
			*out = append(*out, prefix+n)
		}
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, _, _ := strings.Cut(tag, ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if f.Anonymous && name == "" {
				jsonPathsInOrder(f.Type, prefix, out)
				continue
			}
			if name == "" {
				name = f.Name // reported as not snake_case below
			}
			p := prefix + name
			*out = append(*out, p)
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft == tunablesType || ft.Kind() == reflect.Struct:
				jsonPathsInOrder(ft, p+".", out)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				jsonPathsInOrder(ft.Elem(), p+"[].", out)
			}
		}
	}
}

// emittedPaths lists the field paths of a decoded JSON value, stopping at
// maps the document declares as keyed by data.
func emittedPaths(v any, prefix string, dataKeyed map[string]bool, out map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			p := prefix + k
			out[p] = true
			if dataKeyed[p] {
				continue
			}
			emittedPaths(e, p+".", dataKeyed, out)
		}
	case []any:
		for _, e := range x {
			emittedPaths(e, strings.TrimSuffix(prefix, ".")+"[].", dataKeyed, out)
		}
	}
}

// documented reads the field names of one table of the README's JSON
// output section: the first column's backticked names.
func documented(t *testing.T, heading string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i := strings.Index(doc, "\n## JSON output\n")
	if i < 0 {
		t.Fatal(`README.md has no "## JSON output" section`)
	}
	section := doc[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	k := strings.Index(section, "\n### "+heading+"\n")
	if k < 0 {
		t.Fatalf("JSON output has no %q table", heading)
	}
	table := section[k+1:]
	if j := strings.Index(table[4:], "\n### "); j >= 0 {
		table = table[:j+4]
	}
	out := map[string]bool{}
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		out[m[1]] = true
	}
	if len(out) == 0 {
		t.Fatalf("the %q table documents no fields", heading)
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestJSONDocumentsAreDocumented checks the documents and their
// documentation cannot drift: every field a document type can emit is in
// its table and every table entry is a field; names are snake_case with
// no _gib or _ns; and the builders' real output, for plan and both
// simulate modes, emits only documented fields, in an object.
func TestJSONDocumentsAreDocumented(t *testing.T) {
	emitted := map[string][]byte{
		"`plan`":                      runJSON(t, newPlanCmd, "--model", "gpt-1t", "--gpus", "3072", "--gpu", "h100", "--top", "3", "--tokens", "4.5e11", "-o", "json"),
		"`simulate` (with `--trace`)": runJSON(t, newSimulateCmd, "--trace", filepath.Join("..", "..", "scheduler", "trace", "testdata", "philly-multigpu-3034.json"), "--nodes", "40", "-o", "json"),
		"`simulate` (with `--model`)": runJSON(t, newSimulateCmd, "--model", "llama2-70b", "--gpus", "256", "--gpu", "h100", "--mtbf", "2h", "--steps", "20000", "-o", "json"),
	}
	for _, d := range jsonDocs {
		t.Run(d.heading, func(t *testing.T) {
			fields := map[string]bool{}
			jsonPaths(d.typ, "", fields)
			docs := documented(t, d.heading)
			for _, p := range sortedKeys(fields) {
				if !docs[p] {
					t.Errorf("field %s is not documented in the README's %q table", p, d.heading)
				}
				last := p[strings.LastIndex(p, ".")+1:]
				last = strings.TrimSuffix(last, "[]")
				if !snakeCase.MatchString(last) || strings.HasSuffix(last, "_gib") || strings.HasSuffix(last, "_ns") {
					t.Errorf("field %s: names are snake_case with SI units (_bytes, _seconds), not %q", p, last)
				}
			}
			for _, p := range sortedKeys(docs) {
				if !fields[p] {
					t.Errorf("the README's %q table documents %s, which the document does not have", d.heading, p)
				}
			}
			var v any
			if err := json.Unmarshal(emitted[d.heading], &v); err != nil {
				t.Fatalf("output is not JSON: %v", err)
			}
			if _, ok := v.(map[string]any); !ok {
				t.Fatalf("the document is a %T, not an object", v)
			}
			out := map[string]bool{}
			emittedPaths(v, "", map[string]bool{"simulated.recovery_actions": true}, out)
			for _, p := range sortedKeys(out) {
				if !fields[p] {
					t.Errorf("emitted field %s is neither in the document type nor documented", p)
				}
			}
		})
	}
}

// TestJSONNamesMatchJobs checks a plan in the plan document uses the jobs
// document's names for the same things.
func TestJSONNamesMatchJobs(t *testing.T) {
	fields := map[string]bool{}
	jsonPaths(reflect.TypeFor[planner.Document](), "", fields)
	for _, n := range []string{"tp", "pp", "dp", "micro_batch", "num_micro_batches", "virtual_stages",
		"predicted_step_seconds", "predicted_mfu", "predicted_mem_per_gpu_bytes"} {
		if !fields["plans[]."+n] {
			t.Errorf("plans[] lacks %s", n)
		}
	}
	if !fields["tunables.checkpoint_interval_seconds"] || slices.ContainsFunc(sortedKeys(fields), func(s string) bool { return strings.HasSuffix(s, "_ns") }) {
		t.Errorf("the checkpoint interval is checkpoint_interval_seconds, never _ns")
	}
}

// runJSON runs a command in-process and returns its output.
func runJSON(t *testing.T, mk func() *cobra.Command, args ...string) []byte {
	t.Helper()
	cmd := mk()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	if err := cmd.Execute(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out.String())
	}
	return out.Bytes()
}

// TestPrintJSONPaths prints every document's field paths in order, with
// GPUCTL_PRINT_JSON_PATHS set (a help for writing the documentation).
func TestPrintJSONPaths(t *testing.T) {
	if os.Getenv("GPUCTL_PRINT_JSON_PATHS") == "" {
		t.Skip("set GPUCTL_PRINT_JSON_PATHS=1 to print the documents' field paths")
	}
	for _, d := range jsonDocs {
		var order []string
		jsonPathsInOrder(d.typ, "", &order)
		t.Logf("### %s\n%s", d.heading, strings.Join(order, "\n"))
	}
}
