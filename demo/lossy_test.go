package demo

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/agent"
	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// lossyRelay forwards UDP datagrams between one client and a server,
// dropping each with probability loss in both directions. This kernel has
// no netem, so the loss is made here, on loopback.
type lossyRelay struct {
	conn    *net.UDPConn
	server  *net.UDPAddr
	loss    float64
	rng     *rand.Rand
	rngMu   sync.Mutex
	dropped atomic.Uint64
	passed  atomic.Uint64
}

func newLossyRelay(t *testing.T, server string, loss float64) *lossyRelay {
	t.Helper()
	saddr, err := net.ResolveUDPAddr("udp", server)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &lossyRelay{conn: conn, server: saddr, loss: loss, rng: rand.New(rand.NewPCG(1, 2))}
	up, err := net.DialUDP("udp", nil, saddr)
	if err != nil {
		t.Fatal(err)
	}
	var client atomic.Pointer[net.UDPAddr]
	go func() { // client → server
		buf := make([]byte, 65536)
		for {
			n, from, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			client.Store(from)
			if r.drop() {
				continue
			}
			up.Write(buf[:n])
		}
	}()
	go func() { // server → client
		buf := make([]byte, 65536)
		for {
			n, err := up.Read(buf)
			if err != nil {
				return
			}
			if c := client.Load(); c != nil && !r.drop() {
				conn.WriteToUDP(buf[:n], c)
			}
		}
	}()
	t.Cleanup(func() { conn.Close(); up.Close() })
	return r
}

func (r *lossyRelay) drop() bool {
	r.rngMu.Lock()
	d := r.rng.Float64() < r.loss
	r.rngMu.Unlock()
	if d {
		r.dropped.Add(1)
	} else {
		r.passed.Add(1)
	}
	return d
}

func (r *lossyRelay) addr() string { return r.conn.LocalAddr().String() }

// TestNoFalseDownUnderPacketLoss runs a node through a relay that drops 20%
// of datagrams each way for 15 s: with 1 s heartbeats and a 2 s limit, the
// node must never be marked down.
func TestNoFalseDownUnderPacketLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("15 s soak")
	}
	dataDir := t.TempDir()
	srv, stop := runServer(t, dataDir, "127.0.0.1:0")
	t.Cleanup(stop)
	relay := newLossyRelay(t, srv.Addr().String(), 0.20)

	token, _, err := srv.Authority().CreateToken(time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, agent.Config{Server: relay.addr(), Token: token, Name: "lossy", DataDir: t.TempDir()})

	ready := func() bool {
		for _, n := range srv.Nodes() {
			if n.GetRegistration().GetName() == "lossy" {
				return n.GetState() == api.NodeState_NODE_STATE_READY
			}
		}
		return false
	}
	poll(t, 30*time.Second, "node joins through the lossy relay", func() error {
		if !ready() {
			return context.DeadlineExceeded
		}
		return nil
	})
	end := time.Now().Add(15 * time.Second)
	for time.Now().Before(end) {
		if !ready() {
			t.Fatalf("node marked down under 20%% loss (%d datagrams dropped, %d passed)", relay.dropped.Load(), relay.passed.Load())
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	st, err := store.OpenBolt(dataDir + "/state.db")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	evs, _ := st.Events(store.EventFilter{Node: "lossy"})
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_NODE_DOWN {
			t.Fatalf("a node_down event was raised under loss: %v", e)
		}
	}
	t.Logf("20%% loss: %d datagrams dropped, %d passed, node stayed ready", relay.dropped.Load(), relay.passed.Load())
}
