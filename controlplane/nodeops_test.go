package controlplane

import (
	"testing"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

func TestRankNode(t *testing.T) {
	running := &api.Job{Id: "j-1", State: api.JobState_JOB_STATE_RUNNING, Placement: []*api.JobNode{
		{Node: "n0", Ranks: []*api.JobRank{{Rank: 0}, {Rank: 1}}}, {Node: "n1", Ranks: []*api.JobRank{{Rank: 2}, {Rank: 3}}}}}
	pending := &api.Job{Id: "j-2", State: api.JobState_JOB_STATE_PENDING}
	cases := []struct {
		name    string
		job     *api.Job
		rank    int32
		want    string
		wantErr string
	}{
		{"first node", running, 0, "n0", ""},
		{"second node", running, 3, "n1", ""},
		{"no such rank", running, 4, "", "job j-1 has no rank 4: its ranks are 0..3"},
		{"pending", pending, 0, "", "job j-2 is pending and placed nowhere: it has no logs until it starts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := rankNode(tc.job, tc.rank)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestOpsRoles: the least role the authorization table lets make each
// operations request, found by asking it as each role in turn.
func TestOpsRoles(t *testing.T) {
	cases := []struct {
		req  *api.ClientRequest
		want transport.Role
	}{
		{&api.ClientRequest{Body: &api.ClientRequest_ListStalls{ListStalls: &api.ListStallsRequest{}}}, transport.RoleViewer},
		{&api.ClientRequest{Body: &api.ClientRequest_Logs{Logs: &api.LogsRequest{}}}, transport.RoleViewer},
		{&api.ClientRequest{Body: &api.ClientRequest_Cordon{Cordon: &api.CordonRequest{Action: "cordon"}}}, transport.RoleOperator},
		{&api.ClientRequest{Body: &api.ClientRequest_QuietSlow{QuietSlow: &api.QuietSlowRequest{Job: "j", ForNs: 1}}}, transport.RoleOperator},
	}
	roles := []transport.Role{transport.RoleViewer, transport.RoleOperator, transport.RoleAdmin}
	for _, tc := range cases {
		var got transport.Role
		for _, role := range roles {
			if _, _, err := authorize(Caller{Name: "t", Role: role}, tc.req); err == nil {
				got = role
				break
			}
		}
		if got != tc.want {
			t.Errorf("%s needs %q, want %s", requestName(tc.req), got, tc.want)
		}
	}
}
