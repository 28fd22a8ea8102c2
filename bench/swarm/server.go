package swarm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpuctl/gpuctl/procfs"
)

// server is the gpuctl serve process under test.
type server struct {
	pid    int
	config string // admin client config
	cmd    *exec.Cmd
	done   chan struct{}
}

// readyLine is what gpuctl serve prints once it listens.
var readyLine = regexp.MustCompile(`^gpuctl serve listening on (\S+) \(udp\); admin config (\S+)$`)

// startServer starts `gpuctl serve` on a loopback port with its state in
// dir and waits for its ready line.
func startServer(ctx context.Context, gpuctl, dir string) (*server, error) {
	logPath := filepath.Join(dir, "serve.log")
	cmd := exec.Command(gpuctl, "serve", "--data-dir", filepath.Join(dir, "server"), "--listen", "127.0.0.1:0",
		"--log-file", logPath, "--log-level", "warn")
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
