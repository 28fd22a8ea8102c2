package jobspec

import (
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse: it may refuse them, never panic,
// and whatever it accepts must satisfy the invariants the scheduler relies on.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("testdata", "example.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(base))
	f.Add([]byte("name: a\ncommand: [x]\nnodes: 4\nplan: {tp: 8, pp: 2}\nmodel: {preset: llama2-70b}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("fuzz.yaml", data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if s.TotalGPUs() <= 0 || s.Name == "" || len(s.Command) == 0 {
			t.Fatalf("accepted a job without GPUs, name or command: %+v", s)
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted job fails Validate: %v", err)
		}
		if p, ok := s.FixedPlan(); ok && p.TP*p.PP*p.DP != s.TotalGPUs() {
			t.Fatalf("accepted plan %+v does not cover %d GPUs", p, s.TotalGPUs())
		}
		if s.User != "" && !validAccount(s.User) || s.Group != "" && (!validAccount(s.Group) || s.User == "") {
			t.Fatalf("accepted run-as %q:%q", s.User, s.Group)
		}
		if _, _, _, err := s.CostModel(); err != nil {
			t.Fatalf("accepted model does not resolve: %v", err)
		}
	})
}
