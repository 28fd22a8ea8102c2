package api

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

func TestSlurmLaunchRoundTripAndTaskPick(t *testing.T) {
	parts := []NodeLaunch{
		{Node: "node2", Launch: &LaunchRanks{Job: "j", NodeRank: 0, Ranks: []*RankSpec{{Rank: 0, Gpus: []uint32{3}}, {Rank: 1, LocalRank: 1, Gpus: []uint32{4}}}}},
		{Node: "node1", Launch: &LaunchRanks{Job: "j", NodeRank: 1, Ranks: []*RankSpec{{Rank: 2}, {Rank: 3, LocalRank: 1}}}},
	}
	s, err := EncodeLaunch(parts)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeLaunch(SlurmLaunchEnv, s)
	if err != nil || len(got) != 2 || got[1].Node != "node1" || !proto.Equal(got[0].Launch, parts[0].Launch) {
		t.Fatalf("decode = %v, %v", got, err)
	}
	for _, tc := range []struct {
		node, nodeID, local string
		rank                int32
		err                 string
	}{
		// gpuctl's rank order holds whatever order Slurm numbers nodes in.
		{node: "node1", nodeID: "0", local: "1", rank: 3},
		{node: "node2", nodeID: "1", local: "0", rank: 0},
		{node: "node3", nodeID: "0", local: "0", err: "no part"},
		{node: "node2", nodeID: "1", local: "2", err: "--ntasks-per-node"},
	} {
		_, r, err := SlurmTask(got, tc.node, tc.nodeID, tc.local, "")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("SlurmTask(%s,%s,%s) err = %v, want %q", tc.node, tc.nodeID, tc.local, err, tc.err)
			}
			continue
		}
		if err != nil || r.GetRank() != tc.rank {
			t.Errorf("SlurmTask(%s,%s,%s) = rank %d, %v; want %d", tc.node, tc.nodeID, tc.local, r.GetRank(), err, tc.rank)
		}
	}
	// Slurm placed the job: parts by node index.
	placed := []NodeLaunch{{Launch: parts[0].Launch}, {Launch: parts[1].Launch}}
	if l, r, err := SlurmTask(placed, "node7", "1", "0", "10.0.0.7"); err != nil || r.GetRank() != 2 || l.GetMasterAddr() != "10.0.0.7" || parts[1].Launch.GetMasterAddr() != "" {
		t.Errorf("SlurmTask by node id = %v %v, %v", l, r, err)
	}
	for _, bad := range []string{"", "node1", "node1:!!", "node1:AAEC", "node1:CgFq\n", "node1:Cg\rFq", "node1:CgFq=="} {
		if _, err := DecodeLaunch(SlurmLaunchEnv, bad); err == nil {
			t.Errorf("DecodeLaunch(SlurmLaunchEnv, %q) = nil error", bad)
		}
	}
}

func FuzzDecodeLaunch(f *testing.F) {
	s, _ := EncodeLaunch([]NodeLaunch{{Node: "n1", Launch: &LaunchRanks{Job: "j", Ranks: []*RankSpec{{Rank: 0}}}}})
	f.Add(s, "n1", "0", "0")
	f.Fuzz(func(t *testing.T, s, node, nodeID, local string) {
		parts, err := DecodeLaunch(SlurmLaunchEnv, s)
		if err != nil {
			return
		}
		for _, item := range strings.Split(s, ",") {
			if _, enc, _ := strings.Cut(item, ":"); strings.ContainsAny(enc, "\r\n=") {
				t.Fatalf("DecodeLaunch(SlurmLaunchEnv, %q) accepted %q, which is not unpadded base64url", s, enc)
			}
		}
		if l, r, err := SlurmTask(parts, node, nodeID, local, ""); err == nil && (l == nil || r == nil) {
			t.Fatal("SlurmTask: nil launch without an error")
		}
	})
}
