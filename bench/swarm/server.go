package swarm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/procfs"
	"github.com/gpuctl/gpuctl/store/etcdembed"
)

// server is the gpuctl serve process under test.
type server struct {
	pid    int
	config string // admin client config
	cmd    *exec.Cmd
	done   chan struct{}
}

// readyLine is what gpuctl serve prints once it listens, alone or as the
// leader of servers on etcd.
var readyLine = regexp.MustCompile(`^gpuctl serve (?:listening|\S+ leading) on (\S+) \(udp\); admin config (\S+)$`)

// Stores gpuctl bench swarm starts a server on.
const (
	StoreBolt = "bbolt"
	StoreEtcd = "etcd"
)

// backend is where a started server keeps its state: its data dir, and
// for etcd a member run inside this process (as etcd runs beside, not
// inside, the servers of a highly available control plane), which
// outlives a server's restart.
type backend struct {
	dir    string
	listen string // one UDP address for every start: nodes redial it
	etcd   *etcdembed.Member
}

// newBackend prepares the state of a server of kind store under dir.
func newBackend(ctx context.Context, store, dir string) (*backend, error) {
	port, err := freeUDPPort()
	if err != nil {
		return nil, err
	}
	b := &backend{dir: dir, listen: fmt.Sprintf("127.0.0.1:%d", port)}
	switch store {
	case StoreBolt:
		return b, nil
	case StoreEtcd:
	default:
		return nil, fmt.Errorf("swarm: --store %q: use %s or %s", store, StoreBolt, StoreEtcd)
	}
	ports, err := freeTCPPorts(2)
	if err != nil {
		return nil, err
	}
	peer := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	b.etcd, err = etcdembed.Start(ctx, etcdembed.Config{Name: "swarm", DataDir: filepath.Join(dir, "etcd"),
		ClientURLs: fmt.Sprintf("http://127.0.0.1:%d", ports[0]), PeerURLs: peer, InitialCluster: "swarm=" + peer,
		ClusterState: "new", LogFile: filepath.Join(dir, "etcd.log"), ReadyTimeout: 30 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("swarm: start etcd: %w", err)
	}
	return b, nil
}

func (b *backend) close() {
	if b.etcd != nil {
		b.etcd.Close()
	}
}

// args are gpuctl serve's flags for this backend.
func (b *backend) args() []string {
	a := []string{"serve", "--data-dir", filepath.Join(b.dir, "server"), "--listen", b.listen,
		"--log-file", filepath.Join(b.dir, "serve.log"), "--log-level", "warn"}
	if b.etcd != nil {
		a = append(a, "--store", "etcd", "--etcd-endpoints", strings.Join(b.etcd.Endpoints(), ","), "--name", "swarm")
	}
	return a
}

// startServer starts `gpuctl serve` on b's loopback port and state and
// waits for its ready line.
func startServer(ctx context.Context, gpuctl string, b *backend) (*server, error) {
	logPath := filepath.Join(b.dir, "serve.log")
	cmd := exec.Command(gpuctl, b.args()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", gpuctl, err)
	}
	s := &server{pid: cmd.Process.Pid, cmd: cmd, done: make(chan struct{})}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := readyLine.FindStringSubmatch(sc.Text()); m != nil {
				ready <- m[2]
			}
		}
	}()
	go func() { cmd.Wait(); close(s.done) }()
	select {
	case s.config = <-ready:
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("gpuctl serve exited before it listened: %s (see %s)", cmd.ProcessState, logPath)
	case <-time.After(30 * time.Second):
		s.stop()
		return nil, fmt.Errorf("gpuctl serve did not print its ready line within 30s (see %s)", logPath)
	case <-ctx.Done():
		s.stop()
		return nil, ctx.Err()
	}
}

// kill ends a server this run started as a crash would (SIGKILL): nodes
// hear no close.
func (s *server) kill() {
	syscall.Kill(-s.pid, syscall.SIGKILL)
	<-s.done
}

// stop ends a server this run started: SIGTERM, then SIGKILL after 15 s.
// A server it attached to is left running.
func (s *server) stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		syscall.Kill(-s.pid, syscall.SIGKILL)
		<-s.done
	}
}

// freeUDPPort is a loopback UDP port free now.
func freeUDPPort() (int, error) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0, fmt.Errorf("swarm: pick a free port: %w", err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port, nil
}

// freeTCPPorts are n loopback TCP ports free now.
func freeTCPPorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("swarm: pick a free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// usage is a process's CPU time and resident memory at one moment.
type usage struct {
	at       time.Time
	cpu      float64 // seconds
	rssBytes uint64
}

func readUsage(pid int) (usage, error) {
	st, err := procfs.ReadStat("/proc", pid)
	if err != nil {
		return usage{}, err
	}
	return usage{at: time.Now(), cpu: st.CPUSeconds(), rssBytes: st.RSSPages * uint64(os.Getpagesize())}, nil
}

// cores is the CPU used between two readings, in cores.
func cores(a, b usage) float64 {
	if el := b.at.Sub(a.at).Seconds(); el > 0 {
		return (b.cpu - a.cpu) / el
	}
	return 0
}

// udpReceiveDrops is the machine's count of UDP datagrams dropped for a
// full socket receive buffer (RcvbufErrors in /proc/net/snmp): on
// loopback both the server's and the swarm's socket count there. A QUIC
// connection that loses packets waits for its loss recovery.
func udpReceiveDrops() (uint64, error) {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	var names []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "RcvbufErrors" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("/proc/net/snmp has no Udp RcvbufErrors")
}
