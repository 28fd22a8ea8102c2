package jobspec

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
)

// accountRE is a POSIX-portable user or group name as useradd and
// groupadd accept by default (letters, digits, '_', '.', '-', at most 32,
// a trailing '$' for machine accounts).
var accountRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$`)

// validAccount reports whether s names an account: a name, or a numeric id
// below the kernel's (uid_t)-1.
func validAccount(s string) bool {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return n < 1<<32-1
	}
	return accountRE.MatchString(s)
}

func (s *Spec) validateRunAs(c *checker) {
	if s.User != "" && !validAccount(s.User) {
		c.add("user", "%q is neither a user name (letters, digits, '_', '.', '-', at most 32) nor a numeric uid", s.User)
	}
	switch {
	case s.Group != "" && !validAccount(s.Group):
		c.add("group", "%q is neither a group name nor a numeric gid", s.Group)
	case s.Group != "" && s.User == "":
		c.add("group", "needs user: name the user the ranks run as, and the group if not the user's own")
	}
}

// RunAsPolicy says which accounts a submitter may have its ranks run as.
// gpuctl serve fills it from its flags.
type RunAsPolicy struct {
	// DefaultUser and DefaultGroup are what a job that names no user runs
	// as. Without a default, such a job runs as nodemon's own user (which
	// nodemon refuses when that is root, unless started with
	// --allow-root-ranks), and only an admin may submit it.
	DefaultUser, DefaultGroup string
	// OperatorUsers and OperatorGroups are the accounts an operator may
	// name; "*" allows any but root. Admins may name any account.
	OperatorUsers, OperatorGroups []string
	// AllowRoot lets admins (never operators) name root or uid/gid 0.
	AllowRoot bool
	// NodemonUser lets operators submit jobs that name no user when there
	// is no default: their ranks run as nodemon's own user, which nodemon
	// refuses when that is root unless started with --allow-root-ranks. For
	// a cluster of one trust domain, such as gpuctl demo.
	NodemonUser bool
}

// RunAs returns the user and group a job's ranks run as under p: the job's
// own, else the defaults ("" for both: nodemon's own user).
func (p RunAsPolicy) RunAs(s *Spec) (user, group string) {
	if s.User != "" {
		return s.User, s.Group
	}
	return p.DefaultUser, p.DefaultGroup
}

// Roles CheckRunAs knows, as client certificates carry them.
const (
	RoleViewer   = "viewer"
	RoleOperator = "operator"
	RoleAdmin    = "admin"
)

// CheckRunAs decides whether a submitter with role (viewer, operator or
// admin) may have s's ranks run as the account RunAs gives: nobody may
// name root (user root or 0, group root or 0) unless p.AllowRoot, and then
// only an admin; an operator only the accounts p lists; an admin any. A
// refusal is a *ValidationError naming user or group.
func CheckRunAs(s *Spec, role string, p RunAsPolicy) error {
	refuse := func(path, format string, args ...any) error {
		return &ValidationError{Problems: []Problem{{Path: path, Reason: fmt.Sprintf(format, args...)}}}
	}
	if role != RoleOperator && role != RoleAdmin {
		return refuse("", "a %s may not submit jobs: ask for an operator or admin client config", role)
	}
	user, group := p.RunAs(s)
	for _, f := range []struct{ path, v string }{{"user", user}, {"group", group}} {
		if !isRoot(f.v) {
			continue
		}
		switch {
		case !p.AllowRoot:
			return refuse(f.path, "%s: ranks may not run as root on this cluster: name an unprivileged account (gpuctl serve --run-as-allow-root lets admins name root)", f.v)
		case role != RoleAdmin:
			return refuse(f.path, "%s: only an admin may run ranks as root", f.v)
		}
	}
	if role == RoleAdmin {
		return nil
	}
	if user == "" && !p.NodemonUser {
		return refuse("user", "required for an operator: name the account the ranks run as (user: in the job file, or --user); this server sets no default (gpuctl serve --run-as-default)")
	}
	if s.User != "" && user != p.DefaultUser && !allowed(p.OperatorUsers, user) {
		return refuse("user", "%s: an operator may run ranks as %s only: ask an admin to submit it or to allow the account (gpuctl serve --run-as-users)", user, listed(p.OperatorUsers))
	}
	if s.Group != "" && group != p.DefaultGroup && !allowed(p.OperatorGroups, group) {
		return refuse("group", "%s: an operator may use the groups %s only (gpuctl serve --run-as-groups)", group, listed(p.OperatorGroups))
	}
	return nil
}

func isRoot(account string) bool { return account == "root" || account == "0" }

func allowed(list []string, account string) bool {
	return slices.Contains(list, account) || slices.Contains(list, "*") && !isRoot(account)
}

func listed(list []string) string {
	if len(list) == 0 {
		return "the server's default (no accounts are listed)"
	}
	return fmt.Sprintf("%q", list)
}
