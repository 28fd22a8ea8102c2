package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/transport"
	"google.golang.org/protobuf/proto"
)

// TestWitnessBook: a witness vouches until told an attempt is superseded,
// then never again, for that attempt and every earlier one, and a
// restarted nodemon remembers; it reports its last vouch for the job (or
// its start, after a restart) with each acknowledgement.
func TestWitnessBook(t *testing.T) {
	dir := t.TempDir()
	b, err := openWitnessBook(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ask := func(b *witnessBook, job string, attempt uint32) *api.Vouch {
		resp, err := b.answer("5eed", &api.VouchRequest{Attempts: []*api.JobAttemptRef{{Job: job, Attempt: attempt}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVouches()[0]
	}
	if v := ask(b, "j-1", 2); !v.GetVouched() || v.GetSuperseded() {
		t.Fatalf("before any Supersede: %v", v)
	}
	vouchedAt := time.Now()
	time.Sleep(20 * time.Millisecond)
	ago, err := b.supersede("j-1", 2)
	if err != nil {
		t.Fatal(err)
	}
	if ago < 20*time.Millisecond || ago > time.Since(vouchedAt) {
		t.Errorf("vouched ago %s, want about %s", ago, time.Since(vouchedAt))
	}
	for _, attempt := range []uint32{1, 2} {
		if v := ask(b, "j-1", attempt); v.GetVouched() || !v.GetSuperseded() {
			t.Errorf("attempt %d after Supersede(2): %v", attempt, v)
		}
	}
	if v := ask(b, "j-1", 3); !v.GetVouched() {
		t.Errorf("attempt 3 is newer than the one superseded: %v", v)
	}
	if v := ask(b, "j-2", 1); !v.GetVouched() {
		t.Errorf("another job: %v", v)
	}
	// An older Supersede changes nothing.
	if _, err := b.supersede("j-1", 1); err != nil || !b.isSuperseded("j-1", 2) {
		t.Errorf("older supersede: %v, superseded(2)=%v", err, b.isSuperseded("j-1", 2))
	}

	restarted, err := openWitnessBook(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if v := ask(restarted, "j-1", 2); v.GetVouched() {
		t.Errorf("a restarted witness forgot attempt 2 is superseded: %v", v)
	}
	if ago, _ := restarted.supersede("j-2", 1); ago > time.Since(restarted.started) {
		t.Errorf("after a restart the last vouch is bounded by the start: %s", ago)
	}

	if err := os.WriteFile(filepath.Join(dir, "superseded.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := openWitnessBook(dir, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "must never vouch for") {
		t.Errorf("damaged book: %v", err)
	}
}

// TestWitnessBookDeniesRemovedPeers: a peer whose certificate serial the
// server named denied gets no vouch, whatever it asks, until the server's
// list no longer names it; a restarted nodemon remembers the list, and a
// book written before the list existed loads with no one denied.
func TestWitnessBookDeniesRemovedPeers(t *testing.T) {
	dir := t.TempDir()
	b, err := openWitnessBook(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	req := &api.VouchRequest{Attempts: []*api.JobAttemptRef{{Job: "j-1", Attempt: 1}}}
	vouches := func(b *witnessBook, serial string) error {
		t.Helper()
		resp, err := b.answer(serial, req)
		if err != nil {
			return err
		}
		if !resp.GetVouches()[0].GetVouched() {
			t.Fatalf("peer %s: %v", serial, resp)
		}
		return nil
	}
	if err := vouches(b, "a1"); err != nil {
		t.Fatalf("before any deny-list: %v", err)
	}
	if err := b.deny([]string{"a1", "b2"}); err != nil {
		t.Fatal(err)
	}
	if err := vouches(b, "a1"); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("a denied peer: %v", err)
	}
	if err := vouches(b, "c3"); err != nil {
		t.Errorf("a peer not denied: %v", err)
	}
	restarted, err := openWitnessBook(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := vouches(restarted, "b2"); err == nil {
		t.Error("a restarted witness forgot the denied peers")
	}
	if err := restarted.deny(nil); err != nil {
		t.Fatal(err)
	}
	if err := vouches(restarted, "b2"); err != nil {
		t.Errorf("the server's list replaces the one before: %v", err)
	}

	old := t.TempDir()
	if err := os.WriteFile(filepath.Join(old, "superseded.json"), []byte(`{"version":1,"superseded":{"j-7":2}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	ob, err := openWitnessBook(old, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("a book from before the deny-list: %v", err)
	}
	if err := vouches(ob, "a1"); err != nil || !ob.isSuperseded("j-7", 2) {
		t.Errorf("a book from before the deny-list: %v, superseded %v", err, ob.isSuperseded("j-7", 2))
	}
}

func FuzzWitnessFile(f *testing.F) {
	f.Add([]byte(`{"version":1,"superseded":{"j-1":2}}`))
	f.Add([]byte(`{"version":1,"superseded":{"":2}}`))
	f.Add([]byte(`{"version":2}`))
	f.Add([]byte(`{"version":1,"superseded":{},"denied":["3f","a0"]}`))
	f.Add([]byte(`{"version":1,"superseded":{},"denied":[""]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		w, err := parseWitnessFile(data)
		if err != nil {
			return
		}
		for job, a := range w.Superseded {
			if job == "" || a == 0 {
				t.Fatalf("accepted %q: %d", job, a)
			}
		}
		if slices.Contains(w.Denied, "") {
			t.Fatalf("accepted an empty serial: %q", w.Denied)
		}
	})
}

func FuzzVouchRequest(f *testing.F) {
	req, _ := proto.Marshal(&api.VouchRequest{Attempts: []*api.JobAttemptRef{{Job: "j-1", Attempt: 1}, {Job: "j-2", Attempt: 4}}})
	f.Add(req)
	b := &witnessBook{superseded: map[string]uint32{"j-2": 4}, denied: map[string]bool{"bad": true}, vouched: map[string]time.Time{}}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req api.VouchRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		if resp, err := b.answer("bad", &req); err == nil {
			t.Fatalf("a denied peer was answered %v", resp)
		}
		resp, err := b.answer("good", &req)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetVouches()) != len(req.GetAttempts()) {
			t.Fatalf("%d answers to %d attempts", len(resp.GetVouches()), len(req.GetAttempts()))
		}
		for i, v := range resp.GetVouches() {
			if v.GetVouched() == v.GetSuperseded() {
				t.Fatalf("answer %d is both or neither: %v", i, v)
			}
			if a := req.GetAttempts()[i]; a.GetJob() == "j-2" && a.GetAttempt() <= 4 && v.GetVouched() {
				t.Fatalf("vouched for superseded %v", a)
			}
		}
	})
}

// TestVouchesOutlastTheStreamLimit: a node asks its witness once a
// heartbeat on one peer connection, each request on a stream of its own;
// every stream must give its slot back, or the asker blocks once QUIC's
// stream limit (1,024) is used up and its ranks' leases run out (seen
// after 17 minutes of a server away). 1,100 requests in a row are all
// answered.
func TestVouchesOutlastTheStreamLimit(t *testing.T) {
	join := nodeJoiner(t)
	asker, witness := join("gpu-a"), join("gpu-b")
	l, err := transport.ListenPeers("127.0.0.1:0", witness)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	b, err := openWitnessBook(t.TempDir(), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	go b.serve(ctx, l)
	d, err := transport.NewDialer(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	conn, err := d.DialPeer(ctx, l.Addr().String(), "gpu-b", asker)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &api.VouchRequest{Attempts: []*api.JobAttemptRef{{Job: "j-1", Attempt: 1}}}
	for i := range 1100 {
		rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := vouchFrom(rctx, conn, req)
		rcancel()
		if err != nil || !resp.GetVouches()[0].GetVouched() {
			t.Fatalf("request %d: %v %v", i+1, resp, err)
		}
	}
}

// fakeHolder is the executor's side of the voucher, recorded.
type fakeHolder struct {
	attempts []PeerAttempt
	mu       sync.Mutex
	renewed  map[string]time.Time
	fenced   []string
}

func (f *fakeHolder) PeerAttempts() []PeerAttempt { return f.attempts }
func (f *fakeHolder) RenewPeerLease(job string, attempt uint32, deadline time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renewed[job] = deadline
}
func (f *fakeHolder) Fence(s *api.SignalRanks) ([]*api.RankStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fenced = append(f.fenced, s.GetJob())
	return nil, nil
}

// TestRoundWithADeadWitness: a round asks every witness at once, so one
// that swallows every packet (a dead host) costs the others nothing: with
// two of three answering, the attempt is renewed within the round; with
// one of them saying the attempt is superseded, it is fenced.
func TestRoundWithADeadWitness(t *testing.T) {
	join := nodeJoiner(t)
	me := join("gpu-a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var witnesses []*api.Witness
	var books []*witnessBook
	for _, name := range []string{"gpu-b", "gpu-c"} {
		l, err := transport.ListenPeers("127.0.0.1:0", join(name))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		b, err := openWitnessBook(t.TempDir(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		go b.serve(ctx, l)
		books = append(books, b)
		witnesses = append(witnesses, &api.Witness{Name: name, Addr: l.Addr().String()})
	}
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	witnesses = append([]*api.Witness{{Name: "gpu-dead", Addr: hole.LocalAddr().String()}}, witnesses...)
	d, err := transport.NewDialer(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	h := &fakeHolder{renewed: map[string]time.Time{},
		attempts: []PeerAttempt{{Job: "j-1", Attempt: 1, Lease: 5 * time.Second, Witnesses: witnesses}}}
	v := &voucher{id: me, d: d, exec: h, book: &witnessBook{superseded: map[string]uint32{}, vouched: map[string]time.Time{}},
		log: slog.New(slog.DiscardHandler), every: time.Second, conns: map[string]*witnessConn{}, told: map[attemptKey]bool{}}
	start := time.Now()
	v.round(ctx)
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Errorf("the round took %s, more than its interval", took)
	}
	if d := h.renewed["j-1"]; d.Before(start.Add(5*time.Second)) || d.After(time.Now().Add(5*time.Second)) {
		t.Fatalf("renewed to %v, want the round's start plus the lease (2 of 3 vouched)", d)
	}
	if _, err := books[1].supersede("j-1", 1); err != nil {
		t.Fatal(err)
	}
	v.round(ctx)
	eventually(t, "the attempt fenced", 5*time.Second, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(h.fenced) == 1
	})
}

// nodeJoiner starts a server and returns a function that joins a node to
// it and gives the node's identity.
func nodeJoiner(t *testing.T) func(name string) *transport.Identity {
	srv := startLeader(t, t.TempDir(), "", 0)
	addr := srv.Addr().String()
	return func(name string) *transport.Identity {
		t.Helper()
		id, err := transport.Join(context.Background(), addr, token(t, srv), name, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
}

// TestRemovedNodeGetsNoVouch: a node removed with `gpuctl node remove`
// gets no vouch from its peers. A real server (5 s lease) and nodemon
// gpu-a, over loopback QUIC; gpu-b joined, so it holds a node
// certificate of the cluster. gpu-a vouches for gpu-b until gpu-b is
// removed, then refuses it within a few heartbeats, and still refuses it
// after a restart with no server to ask.
func TestRemovedNodeGetsNoVouch(t *testing.T) {
	dir := t.TempDir()
	srv := startLeader(t, filepath.Join(dir, "server"), "", 5*time.Second)
	tok := token(t, srv)
	dataA := filepath.Join(dir, "gpu-a")
	_, stopA := runNode(t, "gpu-a", srv.Addr().String(), tok, dataA)
	idB, err := transport.Join(context.Background(), srv.Addr().String(), token(t, srv), "gpu-b", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "gpu-a registered", 15*time.Second, func() bool { return connectedAt(srv, "gpu-a") })
	var peerA string
	for _, n := range srv.Nodes() {
		if n.GetRegistration().GetName() == "gpu-a" {
			peerA = n.GetRegistration().GetPeerAddr()
		}
	}
	if peerA == "" {
		t.Fatal("gpu-a registered no peer address")
	}
	d, err := transport.NewDialer(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// askA is gpu-b asking gpu-a, on a new connection, to vouch for an
	// attempt gpu-a was never told is superseded.
	askA := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		conn, err := d.DialPeer(ctx, peerA, "gpu-a", idB)
		if err != nil {
			return err
		}
		defer conn.Close()
		resp, err := vouchFrom(ctx, conn, &api.VouchRequest{Attempts: []*api.JobAttemptRef{{Job: "j-1", Attempt: 1}}})
		if err != nil {
			return err
		}
		if !resp.GetVouches()[0].GetVouched() {
			return fmt.Errorf("answered %v", resp)
		}
		return nil
	}
	if err := askA(); err != nil {
		t.Fatalf("before the removal: %v", err)
	}

	cl, err := client.Dial(context.Background(), controlplane.AdminConfigPath(filepath.Join(dir, "server")))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.RemoveNode(context.Background(), "gpu-b", "decommissioned"); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	var refusal error
	eventually(t, "gpu-a refuses gpu-b", 10*time.Second, func() bool {
		refusal = askA()
		return refusal != nil
	})
	if !strings.Contains(refusal.Error(), "revoked") {
		t.Errorf("gpu-b is told %v, want a reason that names the revocation", refusal)
	}
	t.Logf("gpu-a refused gpu-b %s after the removal: %v", time.Since(removed).Round(time.Millisecond), refusal)

	// gpu-a restarted with no server to ask still refuses gpu-b.
	stopA()
	hole, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	runNode(t, "gpu-a", hole.LocalAddr().String(), "", dataA)
	eventually(t, "the restarted gpu-a answers its peers", 10*time.Second, func() bool {
		err := askA()
		return err != nil && strings.Contains(err.Error(), "revoked")
	})
}
