package transport

import (
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestPeerConnections: two nodes of one cluster talk on the peer
// protocol, each seeing the other's verified name; a dialler that expects
// another node at the address, a node of another cluster and a client
// certificate are all refused.
func TestPeerConnections(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	n1, n2 := joinNode(t, ctx, l, a, "n1"), joinNode(t, ctx, l, a, "n2")
	pl, err := ListenPeers("127.0.0.1:0", n2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pl.Close() })
	addr := pl.Addr().String()
	accepted := make(chan *Conn, 4)
	go func() {
		for {
			c, err := pl.Accept(ctx)
			if err != nil {
				return
			}
			accepted <- c
		}
	}()

	c, err := newDialer(t).DialPeer(ctx, addr, "n2", n1)
	if err != nil {
		t.Fatalf("dial n2 as n1: %v", err)
	}
	defer c.Close()
	if c.Name() != "n2" {
		t.Errorf("dialled peer is %q", c.Name())
	}
	srv := <-accepted
	if srv.Name() != "n1" {
		t.Errorf("accepted peer is %q", srv.Name())
	}
	go func() {
		st, err := srv.AcceptStream(ctx)
		if err != nil {
			return
		}
		var req api.VouchRequest
		if st.Recv(&req) == nil {
			st.Send(&api.VouchResponse{Vouches: []*api.Vouch{{Job: req.GetAttempts()[0].GetJob(), Vouched: true}}})
		}
	}()
	resp, err := func() (*api.VouchResponse, error) {
		st, err := c.OpenStream(ctx, StreamRequest)
		if err != nil {
			return nil, err
		}
		if err := st.Send(&api.VouchRequest{Attempts: []*api.JobAttemptRef{{Job: "j-1", Attempt: 1}}}); err != nil {
			return nil, err
		}
		var resp api.VouchResponse
		return &resp, st.Recv(&resp)
	}()
	if err != nil || !resp.GetVouches()[0].GetVouched() {
		t.Fatalf("vouch over the peer connection: %v %v", resp, err)
	}

	if _, err := newDialer(t).DialPeer(ctx, addr, "n3", n1); err == nil || !strings.Contains(err.Error(), `is node "n2", not "n3"`) {
		t.Errorf("dialling n2's address as n3: %v", err)
	}
	other := newAuthority(t, AuthorityOptions{})
	stranger := joinNode(t, ctx, startListener(t, other, ListenConfig{}), other, "n1")
	if _, err := newDialer(t).DialPeer(ctx, addr, "n2", stranger); err == nil {
		t.Error("a node of another cluster was let in")
	}
	admin, err := a.IssueClient("root", RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ListenPeers("127.0.0.1:0", admin); err == nil || !strings.Contains(err.Error(), "node certificate is needed") {
		t.Errorf("peer listener with a client identity: %v", err)
	}
	// TLS 1.3 finishes the dialler's side before the listener has checked
	// its certificate: the refusal shows on first use.
	if ac, err := newDialer(t).DialPeer(ctx, addr, "n2", admin); err == nil {
		st, err := ac.OpenStream(ctx, StreamRequest)
		if err == nil {
			st.Send(&api.VouchRequest{})
			err = st.Recv(&api.VouchResponse{})
		}
		if err == nil {
			t.Error("a client certificate was let in as a peer")
		}
	}
	select {
	case c := <-accepted:
		t.Errorf("the listener accepted %q", c.Name())
	default:
	}
}
