package controlplane

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// TestEveryRequestTypeHasItsRow enumerates every request type of the API
// and asserts its row of the authorization table: the least role, and
// whether it changes the cluster (and is audited). A request type added to
// the API without a row fails here, and is refused by the server.
func TestEveryRequestTypeHasItsRow(t *testing.T) {
	type row struct {
		role    transport.Role
		mutates bool
	}
	want := map[protoreflect.Name]row{
		"list_nodes":        {transport.RoleViewer, false},
		"list_events":       {transport.RoleViewer, false},
		"list_collectives":  {transport.RoleViewer, false},
		"gpu_history":       {transport.RoleViewer, false},
		"observe":           {transport.RoleViewer, false},
		"list_jobs":         {transport.RoleViewer, false},
		"list_stalls":       {transport.RoleViewer, false},
		"logs":              {transport.RoleViewer, false},
		"watch":             {transport.RoleViewer, false},
		"version":           {transport.RoleViewer, false},
		"status":            {transport.RoleViewer, false},
		"submit_job":        {transport.RoleOperator, true},
		"rebalance":         {transport.RoleOperator, true},
		"cancel_job":        {transport.RoleOperator, true},
		"assign_job":        {transport.RoleOperator, true},
		"checkpoint_job":    {transport.RoleOperator, true},
		"restart_job":       {transport.RoleOperator, true},
		"release_job":       {transport.RoleOperator, true},
		"quiet_slow":        {transport.RoleOperator, true},
		"cordon":            {transport.RoleOperator, true},
		"create_join_token": {transport.RoleAdmin, true},
		"list_tokens":       {transport.RoleAdmin, false},
		"revoke_token":      {transport.RoleAdmin, true},
		"add_user":          {transport.RoleAdmin, true},
		"list_identities":   {transport.RoleAdmin, false},
		"revoke_user":       {transport.RoleAdmin, true},
		"remove_node":       {transport.RoleAdmin, true},
		"inject_fault":      {transport.RoleAdmin, true},
	}
	fields := bodyOneof.Fields()
	for i := range fields.Len() {
		name := fields.Get(i).Name()
		w, ok := want[name]
		if !ok {
			t.Errorf("request type %s has no expected row in this test: decide its least role and add it here and to routes", name)
			continue
		}
		got, ok := routes[name]
		if !ok {
			t.Errorf("request type %s has no row in the authorization table: the server refuses it", name)
			continue
		}
		if got.role != w.role || got.mutates != w.mutates {
			t.Errorf("%s: role %s mutates %v, want %s %v", name, got.role, got.mutates, w.role, w.mutates)
		}
		if got.handle == nil {
			t.Errorf("%s: no handler", name)
		}
	}
	for name := range routes {
		if fields.ByName(name) == nil {
			t.Errorf("the table has a row for %s, which is no request type", name)
		}
	}
}

func TestAuthorizeFailsClosed(t *testing.T) {
	viewer := Caller{Name: "bob", Role: transport.RoleViewer, Via: "cert"}
	operator := Caller{Name: "olga", Role: transport.RoleOperator, Via: "ssh"}
	admin := Caller{Name: "root", Role: transport.RoleAdmin, Via: "cert"}
	node := Caller{Name: "node-00", Role: transport.RoleNode, Via: "cert"}
	cordon := &api.ClientRequest{Body: &api.ClientRequest_Cordon{Cordon: &api.CordonRequest{Node: "n1", Action: "cordon"}}}
	dry := &api.ClientRequest{Body: &api.ClientRequest_SubmitJob{SubmitJob: &api.SubmitJobRequest{DryRun: true}}}
	submit := &api.ClientRequest{Body: &api.ClientRequest_SubmitJob{SubmitJob: &api.SubmitJobRequest{}}}
	plan := &api.ClientRequest{Body: &api.ClientRequest_Rebalance{Rebalance: &api.RebalanceRequest{}}}
	apply := &api.ClientRequest{Body: &api.ClientRequest_Rebalance{Rebalance: &api.RebalanceRequest{Apply: true}}}
	fault := &api.ClientRequest{Body: &api.ClientRequest_InjectFault{InjectFault: &api.InjectFaultRequest{}}}
	list := &api.ClientRequest{Body: &api.ClientRequest_ListNodes{ListNodes: &api.ListNodesRequest{}}}
	tests := []struct {
		name    string
		caller  Caller
		req     *api.ClientRequest
		refused string
		mutates bool
	}{
		{"viewer lists", viewer, list, "", false},
		{"viewer cordons", viewer, cordon, "needs the operator role", true},
		{"operator cordons", operator, cordon, "", true},
		{"viewer dry run", viewer, dry, "", false},
		{"viewer submits", viewer, submit, "needs the operator role", true},
		{"viewer plans a rebalance", viewer, plan, "", false},
		{"viewer applies a rebalance", viewer, apply, "needs the operator role", true},
		{"operator injects a fault", operator, fault, "needs the admin role", true},
		{"admin injects a fault", admin, fault, "", true},
		{"a node certificate is no client", node, list, "needs the viewer role", false},
		{"empty request", admin, &api.ClientRequest{}, "empty request", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, mutates, err := authorize(tc.caller, tc.req)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("err %v, want one saying %q", err, tc.refused)
			}
			if mutates != tc.mutates {
				t.Errorf("mutates %v, want %v", mutates, tc.mutates)
			}
		})
	}
	// A request type the table lacks is refused whatever the role.
	saved := routes["list_nodes"]
	delete(routes, "list_nodes")
	defer func() { routes["list_nodes"] = saved }()
	if _, _, err := authorize(admin, list); err == nil || !strings.Contains(err.Error(), "not one this server answers") {
		t.Fatalf("a request missing from the table was let through: %v", err)
	}
}
