package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpuctl/gpuctl/api"
)

// rankCred is the account a job's ranks run as when it is not nodemon's
// own.
type rankCred struct {
	name   string // user name, for messages and USER/LOGNAME
	uid    uint32
	gid    uint32
	groups []uint32 // supplementary groups
	home   string
}

func (c *rankCred) String() string { return fmt.Sprintf("%s (uid %d, gid %d)", c.name, c.uid, c.gid) }

func (c *rankCred) inGroup(gid uint32) bool { return gid == c.gid || slices.Contains(c.groups, gid) }

// runAs resolves the account l's ranks run as on this host: nil means
// nodemon's own user. Ranks never run as root (uid or gid 0) unless
// nodemon was started with --allow-root-ranks, and a nodemon that is not
// root can start ranks only as itself: those refusals are this node's
// (NodeRefusal), the others the job's.
func (x *Executor) runAs(l *api.LaunchRanks) (*rankCred, error) {
	euid, egid := os.Geteuid(), os.Getegid()
	name := l.GetRunAsUser()
	if name == "" && l.GetRunAsGroup() != "" {
		return nil, errors.New("the job names a group but no user: name the user too")
	}
	if name == "" {
		if euid == 0 && !x.opts.AllowRootRanks {
			return nil, &NodeRefusal{fmt.Errorf("its ranks would run as root (the job names no user, and nodemon runs as root on node %s): "+
				"name the account in the job (user: NAME, or gpuctl submit --user NAME), or start nodemon with --allow-root-ranks where root ranks are acceptable", x.opts.Node)}
		}
		return nil, nil
	}
	u, err := lookupUser(name)
	if err != nil {
		return nil, fmt.Errorf("user %q: %w (node %s)", name, err, x.opts.Node)
	}
	c := &rankCred{name: u.Username, home: u.HomeDir}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q has uid %q, not a number", name, u.Uid)
	}
	c.uid = uint32(uid)
	primary := u.Gid
	if g := l.GetRunAsGroup(); g != "" {
		grp, err := lookupGroup(g)
		if err != nil {
			return nil, fmt.Errorf("group %q: %w (node %s)", g, err, x.opts.Node)
		}
		primary = grp.Gid
	}
	gid, err := strconv.ParseUint(primary, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("group of user %q has gid %q, not a number", name, primary)
	}
	c.gid = uint32(gid)
	if ids, err := u.GroupIds(); err == nil {
		for _, s := range ids {
			if g, err := strconv.ParseUint(s, 10, 32); err == nil && uint32(g) != c.gid {
				c.groups = append(c.groups, uint32(g))
			}
		}
	}
	if (c.uid == 0 || c.gid == 0) && !x.opts.AllowRootRanks {
		what := fmt.Sprintf("the job's user %s is root", c)
		if c.uid != 0 {
			what = fmt.Sprintf("the job's ranks would run as %s, in group root", c)
		}
		return nil, &NodeRefusal{fmt.Errorf("%s: nodemon on node %s refuses ranks as root unless started with --allow-root-ranks", what, x.opts.Node)}
	}
	if euid != 0 {
		if int(c.uid) == euid && int(c.gid) == egid {
			return nil, nil // already that account
		}
		return nil, &NodeRefusal{fmt.Errorf("nodemon on node %s runs as uid %d and cannot start ranks as %s: run nodemon as root to run ranks as other users", x.opts.Node, euid, c)}
	}
	return c, nil
}

// lookupUser finds a user by name, or by uid when s is a number.
func lookupUser(s string) (*user.User, error) {
	u, err := user.Lookup(s)
	if err == nil {
		return u, nil
	}
	if _, nerr := strconv.ParseUint(s, 10, 32); nerr == nil {
		if u, err := user.LookupId(s); err == nil {
			return u, nil
		}
		return nil, errors.New("no such uid on this host: create the account (or give its name)")
	}
	var unknown user.UnknownUserError
	if errors.As(err, &unknown) {
		return nil, errors.New("no such user on this host: create the account on every node the job may run on")
	}
	return nil, err
}

func lookupGroup(s string) (*user.Group, error) {
	g, err := user.LookupGroup(s)
	if err == nil {
		return g, nil
	}
	if _, nerr := strconv.ParseUint(s, 10, 32); nerr == nil {
		if g, err := user.LookupGroupId(s); err == nil {
			return g, nil
		}
	}
	var unknown user.UnknownGroupError
	if errors.As(err, &unknown) {
		return nil, errors.New("no such group on this host")
	}
	return nil, err
}

// shimArgs are the rank-shim flags that make it start the rank as c.
func (c *rankCred) shimArgs() []string {
	groups := make([]string, len(c.groups))
	for i, g := range c.groups {
		groups[i] = strconv.FormatUint(uint64(g), 10)
	}
	dir := "/"
	if fi, err := os.Stat(c.home); err == nil && fi.IsDir() && c.home != "" {
		dir = c.home
	}
	return []string{"--uid", strconv.FormatUint(uint64(c.uid), 10), "--gid", strconv.FormatUint(uint64(c.gid), 10),
		"--groups", strings.Join(groups, ","), "--dir", dir}
}

// env is what the rank's environment says about its account, after the
// host's (which is nodemon's: root's HOME and USER).
func (c *rankCred) env() []string {
	return []string{"HOME=" + c.home, "USER=" + c.name, "LOGNAME=" + c.name}
}

// prepareCheckpointDir makes sure the ranks, running as c, can write the
// job's checkpoint dir: the parts of the path nodemon creates belong to c,
// and an existing dir, or a parent it cannot pass, is refused with what
// to change. Nothing that existed is chowned: a job must not be able to
// take over a directory by naming it.
func prepareCheckpointDir(dir string, c *rankCred) error {
	if dir == "" {
		return nil
	}
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("checkpoint dir %q is not an absolute path", dir)
	}
	dir = filepath.Clean(dir)
	// Walk down from /, creating what is missing.
	parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
	path := "/"
	for i, p := range parts {
		path = filepath.Join(path, p)
		leaf := i == len(parts)-1
		fi, err := os.Lstat(path)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(path, 0o750); err != nil && !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("create checkpoint dir %s: %w", path, err)
			}
			if err := os.Lchown(path, int(c.uid), int(c.gid)); err != nil {
				return fmt.Errorf("give %s to %s: %w", path, c, err)
			}
			continue
		case err != nil:
			return fmt.Errorf("checkpoint dir %s: %w", dir, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			// Resolve it and check what it points at.
			if fi, err = os.Stat(path); err != nil {
				return fmt.Errorf("checkpoint dir %s: %w", dir, err)
			}
		}
		if !fi.IsDir() {
			return fmt.Errorf("checkpoint dir %s: %s is not a directory", dir, path)
		}
		want := uint32(1) // search
		if leaf {
			want = 3 // write and search
		}
		if !mayAccess(fi, c, want) {
			st := fi.Sys().(*syscall.Stat_t)
			what := "pass through"
			if leaf {
				what = "write"
			}
			return fmt.Errorf("checkpoint dir %s: %s cannot %s %s (owner uid %d, gid %d, mode %#o): chown the dir to the job's user, or name a checkpoint dir the user can write (checkpoint.dir)",
				dir, c, what, path, st.Uid, st.Gid, fi.Mode().Perm())
		}
	}
	return nil
}

// mayAccess applies the file mode bits (ACLs aside) for c; want is a
// mask of 4 read, 2 write, 1 search.
func mayAccess(fi fs.FileInfo, c *rankCred, want uint32) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return false
	}
	mode := uint32(fi.Mode().Perm())
	switch {
	case st.Uid == c.uid:
		return mode>>6&want == want
	case c.inGroup(st.Gid):
		return mode>>3&want == want
	}
	return mode&want == want
}
