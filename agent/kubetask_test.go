package agent

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestKubeTaskRanks: a pod takes the node its completion index names and
// gives each of that node's ranks exactly api.RankEnv over the pod's own
// environment, without the launch itself, and its log and status file
// under the run dir, named in its environment for nodemon to find; a pod
// gpuctl did not make, a malformed launch, or an index the launch does not
// have, is refused with the reason.
func TestKubeTaskRanks(t *testing.T) {
	launch := func(node int32, ranks ...int32) *api.LaunchRanks {
		l := &api.LaunchRanks{Job: "j-1", Attempt: 3, WorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29500, NodeRank: node, NumNodes: 2,
			Command: []string{"train"}, Env: map[string]string{"NCCL_DEBUG": "WARN"}}
		for i, r := range ranks {
			l.Ranks = append(l.Ranks, &api.RankSpec{Rank: r, LocalRank: int32(i), Gpus: []uint32{uint32(i)}})
		}
		return l
	}
	parts := []api.NodeLaunch{{Node: "a", Launch: launch(0, 0, 1)}, {Node: "b", Launch: launch(1, 2, 3)}}
	enc, err := api.EncodeLaunch(parts)
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"PATH=/usr/bin", "RANK=99", api.KubeLaunchEnv + "=" + enc, api.KubeClusterEnv + "=c1"}
	ranks, err := kubeTaskRanks(append(base, api.KubeIndexEnv+"=1"), "/run/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(ranks) != 2 {
		t.Fatalf("%d ranks for node b, want 2", len(ranks))
	}
	for i, r := range ranks {
		env := r.env
		wantLog := fmt.Sprintf("/run/k/j-1-a3/rank-%d.log", 2+i)
		if r.log != wantLog || r.status != strings.TrimSuffix(wantLog, ".log")+".status" {
			t.Errorf("rank %d: log %s, status %s; want %s and its .status", 2+i, r.log, r.status, wantLog)
		}
		want := append(api.RankEnv("b", "c1", parts[1].Launch, parts[1].Launch.Ranks[i]), api.RankLogEnv+"="+r.log, api.RankStatusEnv+"="+r.status)
		for _, kv := range want {
			if !slices.Contains(env, kv) {
				t.Errorf("rank %d lacks %s", 2+i, kv)
			}
		}
		for _, kv := range env {
			if strings.HasPrefix(kv, api.KubeLaunchEnv+"=") || kv == "RANK=99" {
				t.Errorf("rank %d keeps %.40s", 2+i, kv)
			}
		}
	}
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"not gpuctl's pod", []string{"PATH=/usr/bin", api.KubeIndexEnv + "=0"}, "not created by gpuctl serve --executor kubernetes"},
		{"index past the nodes", append(base, api.KubeIndexEnv+"=2"), "the launch has 2 nodes"},
		{"no index", base, "is not a node index"},
		{"malformed launch", []string{api.KubeLaunchEnv + "=a:!!", api.KubeIndexEnv + "=0"}, api.KubeLaunchEnv + " part 0"},
	} {
		if _, err := kubeTaskRanks(tc.env, "/run/k"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestEchoRankLogs: the pod's output (kubectl logs) follows each rank's
// log, whole lines with the rank in front, a last unfinished line too,
// and a log that appears only after the task started.
func TestEchoRankLogs(t *testing.T) {
	dir := t.TempDir()
	ranks := []kubeRank{
		{env: []string{"RANK=0"}, log: filepath.Join(dir, "rank-0.log")},
		{env: []string{"RANK=1"}, log: filepath.Join(dir, "rank-1.log")},
	}
	if err := os.WriteFile(ranks[0].log, []byte("step 1 loss=2\nste"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	stop := echoRankLogs(ranks, &out)
	f, err := os.OpenFile(ranks[0].log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("p 2 loss=1\n")
	f.Close()
	if err := os.WriteFile(ranks[1].log, []byte("ready\nno newline"), 0o644); err != nil {
		t.Fatal(err)
	}
	stop()
	got := out.String()
	for _, want := range []string{"[rank 0] step 1 loss=2\n", "[rank 0] step 2 loss=1\n", "[rank 1] ready\n", "[rank 1] no newline\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
