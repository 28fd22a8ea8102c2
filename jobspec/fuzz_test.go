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
	f.Add([]byte("name: a\ncommand: [x]\nnodes: 4\nplan: {tp: 8, cp: 2, pp: 2}\nmodel: {preset: llama2-70b}\n"))
	f.Add([]byte("name: a\ncommand: [x]\ngpus: 384\nmodel: {layers: 70, hidden: 14336, heads: 112, seq_len: 2048, vocab: 250880, global_batch: 2048}\nplan: {tp: 4, pp: 12}\n"))
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
		if p, ok := s.FixedPlan(); ok && p.GPUs() != s.TotalGPUs() {
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
