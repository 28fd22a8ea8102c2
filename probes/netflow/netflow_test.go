//go:build linux && amd64

package netflow

import (
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/internal/needs"
)

// requireEBPF skips when the kernel or privileges cannot run eBPF, unless
// eBPF is required here (needs.EBPF), where a skip would hide a regression.
func requireEBPF(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	unsupported := errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) ||
		errors.Is(err, unix.EACCES) || errors.Is(err, os.ErrNotExist)
	if !unsupported {
		t.Fatalf("eBPF failed for a reason other than the kernel or privileges: %v", err)
	}
	needs.EBPF.Skip(t, "eBPF unavailable here: %v", err)
}

// mountTracefs makes tracepoints attachable where tracefs is not mounted.
func mountTracefs(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/sys/kernel/tracing/events"); err == nil {
		return
	}
	if err := unix.Mount("nodev", "/sys/kernel/tracing", "tracefs", 0, ""); err != nil {
		t.Logf("mount tracefs: %v", err)
	}
}

func newTracer(t *testing.T, opts Options) *Tracer {
	t.Helper()
	mountTracefs(t)
	tr, err := New(slog.New(slog.NewTextHandler(io.Discard, nil)), opts)
	requireEBPF(t, err)
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return tr
}

// drainUntil drains tr every 20ms until done says so or 15s pass.
func drainUntil(t *testing.T, tr *Tracer, done func([]*api.NetFlowSample) bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(15 * time.Second)
	for {
		samples, err := tr.Drain(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if done(samples) {
			return
		}
		select {
		case <-tick.C:
		case <-deadline:
			return
		}
	}
}

// transfer sends n bytes from a client to a server over loopback TCP and
// returns the client's and server's local addresses once the server has
// read them all.
func transfer(t *testing.T, n int) (client, server netip.AddrPort) {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		m, err := io.Copy(io.Discard, c)
		if err == nil && m != int64(n) {
			err = errors.New("server read " + strconv.FormatInt(m, 10) + " bytes")
		}
		got <- err
	}()
	c, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client = c.LocalAddr().(*net.TCPAddr).AddrPort()
	buf := make([]byte, 64<<10)
	for sent := 0; sent < n; {
		k := min(len(buf), n-sent)
		if _, err := c.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		sent += k
	}
	c.Close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	return client, ln.Addr().(*net.TCPAddr).AddrPort()
}

func TestLoopbackTransferCounted(t *testing.T) {
	tr := newTracer(t, Options{})
	const n = 3<<20 + 12345
	client, server := transfer(t, n)

	pid := uint32(os.Getpid())
	var tx, rx uint64
	drainUntil(t, tr, func(samples []*api.NetFlowSample) bool {
		for _, s := range samples {
			if s.Pid != pid || s.Protocol != "tcp" {
				continue
			}
			if s.LocalAddr == client.String() && s.RemoteAddr == server.String() {
				tx += s.TxBytes
			}
			if s.LocalAddr == server.String() && s.RemoteAddr == client.String() {
				rx += s.RxBytes
			}
		}
		return tx >= n && rx >= n
	})
	if tx < n {
		t.Errorf("client flow %v -> %v sent %d bytes, want >= %d", client, server, tx, n)
	}
	if rx < n {
		t.Errorf("server flow %v -> %v received %d bytes, want >= %d", server, client, rx, n)
	}
	if lost := tr.Lost(); lost != 0 {
		t.Errorf("lost %d flow updates with a near-empty map", lost)
	}
}

func TestDrainReturnsDeltas(t *testing.T) {
	tr := newTracer(t, Options{})
	const n = 1 << 20
	client, server := transfer(t, n)
	match := func(s *api.NetFlowSample) bool {
		return s.LocalAddr == client.String() && s.RemoteAddr == server.String()
	}
	var first uint64
	drainUntil(t, tr, func(samples []*api.NetFlowSample) bool {
		for _, s := range samples {
			if match(s) {
				first += s.TxBytes
			}
		}
		return first >= n
	})
	if first != n {
		t.Fatalf("first drains saw %d bytes on the client flow, want %d", first, n)
	}
	// The connection is closed: nothing more may be reported for it.
	for range 2 {
		samples, err := tr.Drain(time.Now())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range samples {
			if match(s) && s.TxBytes != 0 {
				t.Errorf("drain after the transfer reported %d more bytes", s.TxBytes)
			}
		}
	}
}

func TestLookupFiltersAndLabels(t *testing.T) {
	self := uint32(os.Getpid())
	tr := newTracer(t, Options{Lookup: func(pid uint32) (string, int32, bool) {
		if pid == self {
			return "job-a", 3, true
		}
		return "", -1, false
	}})
	client, server := transfer(t, 4096)
	found := false
	drainUntil(t, tr, func(samples []*api.NetFlowSample) bool {
		for _, s := range samples {
			if s.Pid != self {
				t.Errorf("flow of pid %d reported; the lookup rejects it", s.Pid)
			}
			if s.Job != "job-a" || s.Rank != 3 {
				t.Errorf("flow labelled job %q rank %d, want job-a rank 3", s.Job, s.Rank)
			}
			if s.LocalAddr == client.String() && s.RemoteAddr == server.String() {
				found = true
			}
		}
		return found
	})
	if !found {
		t.Errorf("no flow %v -> %v", client, server)
	}
}

func TestFormatAddr(t *testing.T) {
	v4 := [16]byte{127, 0, 0, 1}
	v6 := [16]byte{15: 1}
	mapped := [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 1, 14: 2, 15: 3}
	for _, tc := range []struct {
		name   string
		family uint16
		raw    [16]byte
		port   uint16
		want   string
	}{
		{"ipv4", afInet, v4, 8080, "127.0.0.1:8080"},
		{"ipv6", afInet6, v6, 443, "[::1]:443"},
		{"v4-mapped ipv6 prints as ipv4", afInet6, mapped, 29500, "10.1.2.3:29500"},
		{"unknown family", 1, v4, 0, "family 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := formatAddr(tc.family, tc.raw, tc.port); got != tc.want {
				t.Errorf("formatAddr = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestProtocolName(t *testing.T) {
	for p, want := range map[uint16]string{6: "tcp", 17: "udp", 132: "ip-proto-132"} {
		if got := protocolName(p); got != want {
			t.Errorf("protocolName(%d) = %q, want %q", p, got, want)
		}
	}
}

// FuzzSample checks that any flow record from the kernel converts without
// panicking and that addresses parse back.
func FuzzSample(f *testing.F) {
	f.Add(uint16(afInet), []byte{127, 0, 0, 1}, []byte{127, 0, 0, 1}, uint16(1), uint16(2), uint16(6), uint32(7))
	f.Add(uint16(afInet6), []byte{15: 1}, []byte{10: 0xff, 11: 0xff, 12: 1}, uint16(443), uint16(0), uint16(17), uint32(0))
	f.Add(uint16(0), []byte{}, []byte{}, uint16(0), uint16(0), uint16(0), uint32(0))
	f.Fuzz(func(t *testing.T, family uint16, l, r []byte, lport, rport, proto uint16, pid uint32) {
		var k netflowFlowKey
		copy(k.Laddr[:], l)
		copy(k.Raddr[:], r)
		k.Family, k.Lport, k.Rport, k.Protocol, k.Pid = family, lport, rport, proto, pid
		s := sample(&k, &netflowFlowStats{TxBytes: 1})
		if s.Pid != pid || s.TxBytes != 1 || s.Protocol == "" {
			t.Fatalf("sample lost fields: %v", s)
		}
		if family != afInet && family != afInet6 {
			return
		}
		for _, a := range []string{s.LocalAddr, s.RemoteAddr} {
			if _, err := netip.ParseAddrPort(a); err != nil {
				t.Fatalf("address %q does not parse: %v", a, err)
			}
		}
	})
}

func TestRetransmitsCounted(t *testing.T) {
	tr := newTracer(t, Options{})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err := net.Dial("tcp4", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	server, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close() })

	// A classic socket filter that accepts nothing makes the server's TCP
	// drop every segment it is sent, so the client must retransmit.
	raw, err := server.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		drop := []unix.SockFilter{{Code: unix.BPF_RET | unix.BPF_K, K: 0}}
		serr = unix.SetsockoptSockFprog(int(fd), unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
			&unix.SockFprog{Len: uint16(len(drop)), Filter: &drop[0]})
	}); err != nil || serr != nil {
		t.Fatalf("attach drop-all socket filter: %v %v", err, serr)
	}
	if _, err := client.Write([]byte("retransmit me")); err != nil {
		t.Fatal(err)
	}
	local := client.LocalAddr().(*net.TCPAddr).AddrPort().String()
	remote := ln.Addr().(*net.TCPAddr).AddrPort().String()
	pid := uint32(os.Getpid())
	var retrans uint64
	drainUntil(t, tr, func(samples []*api.NetFlowSample) bool {
		for _, s := range samples {
			if s.LocalAddr == local && s.RemoteAddr == remote {
				if s.Pid != pid {
					t.Errorf("retransmit charged to pid %d, want the socket's owner %d", s.Pid, pid)
				}
				retrans += s.Retransmits
			}
		}
		return retrans > 0
	})
	if retrans == 0 {
		t.Fatalf("no retransmit counted on %s -> %s", local, remote)
	}
}
