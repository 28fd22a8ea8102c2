package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestKubeTaskEnvs: a pod takes the node its completion index names and
// gives each of that node's ranks exactly api.RankEnv over the pod's own
// environment, without the launch itself; a pod gpuctl did not make, or
// an index the launch does not have, is refused with the reason.
func TestKubeTaskEnvs(t *testing.T) {
	launch := func(node int32, ranks ...int32) *api.LaunchRanks {
		l := &api.LaunchRanks{Job: "j-1", Attempt: 3, WorldSize: 4, MasterAddr: "10.0.0.1", MasterPort: 29500, NodeRank: node, NumNodes: 2,
			Command: []string{"train"}, Env: map[string]string{"NCCL_DEBUG": "WARN"}}
		for i, r := range ranks {
			l.Ranks = append(l.Ranks, &api.RankSpec{Rank: r, LocalRank: int32(i), Gpus: []uint32{uint32(i)}})
		}
		return l
	}
	parts := []api.SlurmNodeLaunch{{Node: "a", Launch: launch(0, 0, 1)}, {Node: "b", Launch: launch(1, 2, 3)}}
	enc, err := api.EncodeSlurmLaunch(parts)
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"PATH=/usr/bin", "RANK=99", api.KubeLaunchEnv + "=" + enc, api.KubeClusterEnv + "=c1"}
	envs, err := kubeTaskEnvs(append(base, api.KubeIndexEnv+"=1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(envs) != 2 {
		t.Fatalf("%d rank environments for node b, want 2", len(envs))
	}
	for i, env := range envs {
		want := api.RankEnv("b", "c1", parts[1].Launch, parts[1].Launch.Ranks[i])
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
	} {
		if _, err := kubeTaskEnvs(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
