package kubetest

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// process is one program of the cluster, its output in dir/name.log.
type process struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start runs program, one of the Kubernetes programs of BinDir, as the
// process called name.
func (c *Cluster) start(name, program string, args ...string) *process {
	c.t.Helper()
	return c.startPath(name, filepath.Join(BinDir(c.t), program), args...)
}

// startPath runs path as the process called name.
func (c *Cluster) startPath(name, path string, args ...string) *process {
	c.t.Helper()
	logPath := filepath.Join(c.dir, name+".log")
	// Appended to: a kubelet started again keeps one log.
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own group, so a stop reaches what it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		c.t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		f.Close()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	return p
}

// stop ends p: SIGTERM, then SIGKILL to its group after grace.
func (p *process) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// exited reports whether p has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// logTail is the last lines of a process's log, for a failure message.
func (c *Cluster) logTail(name string) string {
	data, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// stop ends the cluster: the kubelets' containers first (a kubelet's exit
// leaves them running), then the programs, then what they left mounted
// under the cluster's directory.
func (c *Cluster) stop() {
	for _, k := range c.kubelets {
		if k.kubelet != nil {
			k.kubelet.stop(10 * time.Second)
		}
		k.removeContainers()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop(10 * time.Second)
	}
	unmountUnder(c.dir)
	if c.ownsKubeletDir {
		os.RemoveAll(kubeletStateDir)
	}
	if c.hostLock != nil {
		c.hostLock.Close()
	}
	if c.t.Failed() {
		c.t.Logf("kubetest: logs kept in %s", c.dir)
		return
	}
	os.RemoveAll(c.dir)
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	for i := len(points) - 1; i >= 0; i-- {
		syscall.Unmount(points[i], syscall.MNT_DETACH)
	}
}
