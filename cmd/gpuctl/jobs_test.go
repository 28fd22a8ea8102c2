package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/jobspec"
)

// TestSubmitRequest checks the job the server receives from flags or a
// file: flags become a YAML job file that parses back to the same job.
func TestSubmitRequest(t *testing.T) {
	file := filepath.Join(t.TempDir(), "job.yaml")
	if err := os.WriteFile(file, []byte("name: f\ncommand: [/bin/true]\ngpus: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		args []string
		want func(t *testing.T, s *jobspec.Spec)
		err  string
	}{
		{name: "flags", args: []string{"--name", "ring", "--nodes", "2", "--gpus-per-node", "4", "--priority", "7", "--tenant", "lab",
			"--checkpoint-dir", "/ckpt/ring", "--checkpoint-interval", "10m", "--env", "A=b", "--elastic-dp", "8,4", "--",
			"/opt/ringtrain", "--steps", "100"},
			want: func(t *testing.T, s *jobspec.Spec) {
				want := &jobspec.Spec{Name: "ring", Tenant: "lab", Priority: 7, Nodes: 2, GPUsPerNode: 4,
					Command: []string{"/opt/ringtrain", "--steps", "100"}, Env: map[string]string{"A": "b"},
					Checkpoint:    jobspec.CheckpointSpec{Dir: "/ckpt/ring", Interval: 10 * 60e9},
					Elastic:       &jobspec.ElasticSpec{DataParallel: []int{8, 4}},
					RestartPolicy: jobspec.RestartInPlace,
					StallRecovery: jobspec.StallManual,
					SlowRecovery:  jobspec.SlowAlert}
				if !reflect.DeepEqual(s, want) {
					t.Errorf("got  %+v\nwant %+v", s, want)
				}
			}},
		{name: "file", args: []string{"-f", file}, want: func(t *testing.T, s *jobspec.Spec) {
			if s.Name != "f" || s.GPUs != 2 {
				t.Errorf("spec %+v", s)
			}
		}},
		{name: "file and command", args: []string{"-f", file, "--", "x"}, err: "not both"},
		{name: "file and flags", args: []string{"-f", file, "--gpus", "4"}, err: "--gpus and -f both describe the job"},
		{name: "no command", args: []string{"--name", "x", "--gpus", "2"}, err: "give a job file with -f, or the command after --"},
		{name: "command without dash", args: []string{"--name", "x", "--gpus", "2", "train.py"}, err: "put the command after --"},
		{name: "bad flags", args: []string{"--name", "X", "--gpus", "2", "--", "x"}, err: "--name"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var f submitFlags
			cmd := submitCmd(&f)
			if err := cmd.Flags().Parse(c.args); err != nil {
				t.Fatal(err)
			}
			req, err := submitRequest(cmd, &f, cmd.Flags().Args())
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("err %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s, err := jobspec.Parse(req.GetSource(), []byte(req.GetSpecYaml()))
			if err != nil {
				t.Fatalf("server would refuse:\n%s\n%v", req.GetSpecYaml(), err)
			}
			c.want(t, s)
		})
	}
}
