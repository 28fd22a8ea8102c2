// Package slurmtest starts a real Slurm cluster for tests, in a temp dir:
// munged with its own key and socket, slurmctld, and one slurmd per node
// (slurmd -N nodeN; Debian's build runs several on one host), each with its
// own port and spool, and fake GPUs (character devices, major 195) for
// Gres=gpu. Every daemon it starts is stopped by pid at cleanup.
package slurmtest

import (
	"fmt"
	"github.com/gpuctl/gpuctl/internal/needs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Binaries Slurm tests need.
var (
	Slurmctld = "/usr/sbin/slurmctld"
	Slurmd    = "/usr/sbin/slurmd"
	Munged    = "/usr/sbin/munged"
)

// Cluster is a running Slurm.
type Cluster struct {
	Dir string
	// Conf is slurm.conf; the CLI tools find it through Env.
	Conf  string
	Nodes []string
	// GPUs per node.
	GPUs int
	t    testing.TB
	ctld *exec.Cmd
	// slurmd per node.
	slurmd map[string]*exec.Cmd
	ports  map[string]int
	munge  *exec.Cmd
}

// Options shapes the cluster.
type Options struct {
	Nodes int // default 4
	GPUs  int // per node, default 8
	CPUs  int // per node, default GPUs
}

// Available reports whether the Slurm daemons are installed.
func Available() bool {
	for _, b := range []string{Slurmctld, Slurmd, Munged, "/usr/sbin/mungekey"} {
		if _, err := os.Stat(b); err != nil {
			return false
		}
	}
	for _, b := range []string{"sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun"} {
		if _, err := exec.LookPath(b); err != nil {
			return false
		}
	}
	return true
}

// Require skips t when Slurm is absent, unless GPUCTL_REQUIRE_SLURM says
// it must be there, and when the test is not root (slurmd runs as root).
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real Slurm daemons")
	}
	missing := !Available()
	if !missing && os.Geteuid() != 0 {
		missing = true
	}
	if missing {
		needs.Slurm.Skip(t, "slurmctld, slurmd, munged or the Slurm CLI tools are missing, or this is not root (apt-get install slurm-wlm munge; run as root)")
	}
}

// Start brings up munged, slurmctld and the slurmds and waits until every
// node is idle.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	Require(t)
	if o.Nodes <= 0 {
		o.Nodes = 4
	}
	if o.GPUs <= 0 {
		o.GPUs = 8
	}
	if o.CPUs <= 0 {
		o.CPUs = o.GPUs
	}
	// Short: slurmd's socket paths and munge's socket must fit sun_path.
	dir, err := os.MkdirTemp("", "slurm")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	c := &Cluster{Dir: dir, Conf: filepath.Join(dir, "slurm.conf"), GPUs: o.GPUs, t: t,
		slurmd: map[string]*exec.Cmd{}, ports: map[string]int{}}
	t.Cleanup(c.stop)
	for i := 1; i <= o.Nodes; i++ {
		c.Nodes = append(c.Nodes, fmt.Sprintf("node%d", i))
	}
	for _, d := range []string{"munge", "ctld", "log", "dev"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "munge"), 0o700)
	key := filepath.Join(dir, "munge", "munge.key")
	if out, err := exec.Command("/usr/sbin/mungekey", "-c", "-b", "1024", "-k", key).CombinedOutput(); err != nil {
		t.Fatalf("mungekey: %v\n%s", err, out)
	}
	sock := filepath.Join(dir, "munge", "sock")
	c.munge = c.daemon("munged", Munged, "-F", "-f", "--socket="+sock, "--key-file="+key,
		"--log-file="+filepath.Join(dir, "log", "munged.log"), "--pid-file="+filepath.Join(dir, "munge", "pid"),
		"--seed-file="+filepath.Join(dir, "munge", "seed"))
	waitFor(t, 5*time.Second, "munged socket", func() bool { _, err := os.Stat(sock); return err == nil })

	var gres strings.Builder
	for i, n := range c.Nodes {
		dd := filepath.Join(dir, "dev", n)
		os.MkdirAll(dd, 0o755)
		for g := 0; g < o.GPUs; g++ {
			// The fake GPUs: what slurmd's gres/gpu checks is a character
			// device at File=, major 195 as NVIDIA's.
			p := filepath.Join(dd, fmt.Sprintf("nvidia%d", g))
			if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(mkdev(195, uint32(i*o.GPUs+g)))); err != nil {
				t.Fatalf("mknod %s (fake GPU): %v", p, err)
			}
		}
		fmt.Fprintf(&gres, "NodeName=%s Name=gpu File=%s/nvidia[0-%d]\n", n, dd, o.GPUs-1)
		os.MkdirAll(filepath.Join(dir, "spool-"+n), 0o755)
	}
	ports := freePorts(t, 2+o.Nodes)
	var nodeLines strings.Builder
	for i, n := range c.Nodes {
		c.ports[n] = ports[2+i]
		fmt.Fprintf(&nodeLines, "NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=%d RealMemory=1000 Gres=gpu:%d State=UNKNOWN\n",
			n, ports[2+i], o.CPUs, o.GPUs)
	}
	conf := fmt.Sprintf(`ClusterName=gpuctltest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[3]s,cred_expire=5
StateSaveLocation=%[4]s/ctld
SlurmdSpoolDir=%[4]s/spool-%%n
SlurmctldPidFile=%[4]s/ctld/pid
SlurmdPidFile=%[4]s/spool-%%n/pid
SlurmctldLogFile=%[4]s/log/slurmctld.log
SlurmdLogFile=%[4]s/log/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
MpiDefault=none
ReturnToService=1
SlurmdTimeout=5
SlurmctldTimeout=5
InactiveLimit=0
MinJobAge=60
KillWait=2
MessageTimeout=5
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
%sPartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
`, ports[0], ports[1], sock, dir, nodeLines.String())
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), []byte(gres.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c.ctld = c.daemon("slurmctld", Slurmctld, "-D", "-i", "-f", c.Conf)
	for _, n := range c.Nodes {
		c.StartNode(n)
	}
	waitFor(t, 20*time.Second, "every Slurm node idle", func() bool {
		out, err := c.Command("sinfo", "-h", "-N", "-o", "%N|%T").Output()
		return err == nil && strings.Count(string(out), "|idle") == len(c.Nodes)
	})
	return c
}

// Env is the environment the Slurm CLI tools need (SLURM_CONF).
func (c *Cluster) Env() []string { return append(os.Environ(), "SLURM_CONF="+c.Conf) }

// Command is a Slurm CLI tool run against this cluster.
func (c *Cluster) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = c.Env()
	return cmd
}

// Run runs a Slurm CLI tool and fails the test when it fails.
func (c *Cluster) Run(name string, args ...string) string {
	c.t.Helper()
	out, err := c.Command(name, args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// StartNode (re)starts node's slurmd.
func (c *Cluster) StartNode(n string) {
	c.slurmd[n] = c.daemon("slurmd-"+n, Slurmd, "-D", "-N", n, "-f", c.Conf)
}

// StopNode kills node's slurmd (SIGKILL), as a crashed host would.
func (c *Cluster) StopNode(n string) {
	if cmd := c.slurmd[n]; cmd != nil {
		cmd.Process.Kill()
		cmd.Wait()
		delete(c.slurmd, n)
	}
}

// StopController kills slurmctld, leaving the CLI tools without an
// answer, as a crashed controller would.
func (c *Cluster) StopController() {
	if c.ctld != nil {
		c.ctld.Process.Kill()
		c.ctld.Wait()
		c.ctld = nil
	}
}

// StartController starts slurmctld again, keeping its state.
func (c *Cluster) StartController() {
	c.ctld = c.daemon("slurmctld-again", Slurmctld, "-D", "-f", c.Conf)
}

// Logs returns the tail of every daemon log, for a failing test.
func (c *Cluster) Logs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(c.Dir, "log", "*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		if len(data) > 4000 {
			data = data[len(data)-4000:]
		}
		fmt.Fprintf(&b, "== %s\n%s\n", f, data)
	}
	return b.String()
}

func (c *Cluster) daemon(name, bin string, args ...string) *exec.Cmd {
	c.t.Helper()
	out, err := os.Create(filepath.Join(c.Dir, "log", name+".out"))
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = c.Env()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	out.Close()
	return cmd
}

func (c *Cluster) stop() {
	if c.t.Failed() {
		c.t.Logf("Slurm logs:\n%s", c.Logs())
	}
	stop := func(cmd *exec.Cmd) {
		if cmd == nil || cmd.Process == nil {
			return
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	for _, cmd := range c.slurmd {
		stop(cmd)
	}
	// Job steps outlive a slurmd (slurmstepd is its own process): kill
	// what still runs under this cluster's spool dirs.
	c.killSteps()
	stop(c.ctld)
	stop(c.munge)
	os.RemoveAll(c.Dir)
}

// killSteps kills this cluster's slurmstepd processes: those whose
// environment names its slurm.conf.
func (c *Cluster) killSteps() {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if strings.TrimSpace(string(comm)) != "slurmstepd" {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if strings.Contains(string(env), "SLURM_CONF="+c.Conf+"\x00") {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func mkdev(major, minor uint32) uint64 {
	return uint64(major&0xfff)<<8 | uint64(minor&0xff) | uint64(minor&^0xff)<<12 | uint64(major&^0xfff)<<32
}

func freePorts(t testing.TB, n int) []int {
	var ls []net.Listener
	var out []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}

func waitFor(t testing.TB, d time.Duration, what string, ok func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !ok() {
		if time.Now().After(end) {
			t.Fatalf("slurmtest: timed out after %v waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
