package jobspec

import (
	"strings"
	"testing"
)

func TestRunAsFields(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"user and group", base + "user: alice\ngroup: ml\n", ""},
		{"numeric", base + "user: '1001'\ngroup: '1001'\n", ""},
		{"machine account", base + "user: build$\n", ""},
		{"user with a space", base + "user: alice smith\n", `job.yaml:4: user: "alice smith" is neither a user name`},
		{"user with a slash", base + "user: ../root\n", `job.yaml:4: user: "../root" is neither`},
		{"uid out of range", base + "user: '4294967295'\n", "job.yaml:4: user:"},
		{"group without user", base + "group: ml\n", "job.yaml:4: group: needs user"},
		{"bad group", base + "user: alice\ngroup: 'a;b'\n", `job.yaml:5: group: "a;b" is neither`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse("job.yaml", []byte(tc.yaml))
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if s.User == "" {
					t.Fatalf("user lost: %+v", s)
				}
				return
			}
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %v, want prefix %q", err, tc.want)
			}
		})
	}
	s, err := FromFlags(Flags{Name: "a", GPUs: 8, Command: []string{"x"}, User: "alice", Group: "ml"})
	if err != nil || s.User != "alice" || s.Group != "ml" {
		t.Fatalf("FromFlags = %+v, %v", s, err)
	}
	if _, err := FromFlags(Flags{Name: "a", GPUs: 8, Command: []string{"x"}, Group: "ml"}); err == nil || !strings.HasPrefix(err.Error(), "--group: needs user") {
		t.Fatalf("--group alone: %v", err)
	}
}

func TestCheckRunAs(t *testing.T) {
	open := RunAsPolicy{OperatorUsers: []string{"alice", "svc-train"}, OperatorGroups: []string{"ml"}}
	withDefault := RunAsPolicy{DefaultUser: "gpuctl-jobs", OperatorUsers: []string{"alice"}}
	rootOK := RunAsPolicy{AllowRoot: true, OperatorUsers: []string{"*"}}
	any := RunAsPolicy{OperatorUsers: []string{"*"}, OperatorGroups: []string{"*"}}
	spec := func(user, group string) *Spec { return &Spec{Name: "j", User: user, Group: group} }
	tests := []struct {
		name   string
		spec   *Spec
		role   string
		policy RunAsPolicy
		want   string // "" = allowed; else a substring of the refusal
	}{
		{"operator, listed user", spec("alice", ""), RoleOperator, open, ""},
		{"operator, listed user and group", spec("svc-train", "ml"), RoleOperator, open, ""},
		{"operator, unlisted user", spec("bob", ""), RoleOperator, open, `user: bob: an operator may run ranks as ["alice" "svc-train"] only`},
		{"operator, unlisted group", spec("alice", "wheel"), RoleOperator, open, "group: wheel: an operator may use the groups"},
		{"operator, no user, no default", spec("", ""), RoleOperator, open, "user: required for an operator"},
		{"operator, no user, default", spec("", ""), RoleOperator, withDefault, ""},
		{"operator, no user, nodemon's user allowed", spec("", ""), RoleOperator, RunAsPolicy{NodemonUser: true}, ""},
		{"operator, root by name, nodemon's user allowed", spec("root", ""), RoleOperator, RunAsPolicy{NodemonUser: true}, "may not run as root"},
		{"operator, the default named", spec("gpuctl-jobs", ""), RoleOperator, withDefault, ""},
		{"operator, root", spec("root", ""), RoleOperator, open, "user: root: ranks may not run as root on this cluster"},
		{"operator, uid 0", spec("0", ""), RoleOperator, any, "user: 0: ranks may not run as root"},
		{"operator, root group", spec("alice", "root"), RoleOperator, any, "group: root: ranks may not run as root"},
		{"operator, root though allowed", spec("root", ""), RoleOperator, rootOK, "only an admin may run ranks as root"},
		{"operator, wildcard", spec("anyone", ""), RoleOperator, any, ""},
		{"operator, nothing listed", spec("alice", ""), RoleOperator, RunAsPolicy{}, "no accounts are listed"},
		{"admin, any user", spec("bob", "wheel"), RoleAdmin, open, ""},
		{"admin, no user", spec("", ""), RoleAdmin, RunAsPolicy{}, ""},
		{"admin, root", spec("root", ""), RoleAdmin, open, "may not run as root on this cluster"},
		{"admin, root allowed", spec("root", ""), RoleAdmin, rootOK, ""},
		{"admin, default root", spec("", ""), RoleAdmin, RunAsPolicy{DefaultUser: "root"}, "may not run as root"},
		{"viewer", spec("alice", ""), RoleViewer, any, "a viewer may not submit jobs"},
		{"unknown role", spec("alice", ""), "", any, "may not submit jobs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckRunAs(tc.spec, tc.role, tc.policy)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("allowed, want a refusal containing %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("refusal %q lacks %q", err, tc.want)
			}
		})
	}
	if u, g := withDefault.RunAs(spec("", "")); u != "gpuctl-jobs" || g != "" {
		t.Errorf("RunAs with a default = %q %q", u, g)
	}
}
