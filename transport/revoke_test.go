package transport

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// denyList is the shape of the server's deny-list: revoked serials.
type denyList struct {
	mu      sync.Mutex
	revoked map[string]string
}

func (d *denyList) revoke(serial, why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.revoked[serial] = why
}

func (d *denyList) check(_ context.Context, p PeerInfo) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if why, ok := d.revoked[Serial(p.Cert)]; ok {
		return fmt.Errorf("certificate of %s %q (serial %s) was revoked: %s", p.Role, p.Name, Serial(p.Cert), why)
	}
	return nil
}

func TestCheckPeerAndDisconnect(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	deny := &denyList{revoked: map[string]string{}}
	l := startListener(t, a, ListenConfig{CheckPeer: deny.check})
	addr := l.Addr().String()
	bob, err := a.IssueClient("bob", RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	node := joinNode(t, ctx, l, a, "gpu-01")

	// Open connections of bob and of the node, then revoke bob.
	bc, err := newDialer(t).DialClient(ctx, addr, bob)
	if err != nil {
		t.Fatal(err)
	}
	acceptOne(t, ctx, l)
	nc, err := newDialer(t).DialNode(ctx, addr, node)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	served := acceptOne(t, ctx, l)
	if served.Serial() != Serial(node.Certificate.Leaf) || served.Certificate() == nil {
		t.Fatalf("server-side conn serial %q, node cert %q", served.Serial(), Serial(node.Certificate.Leaf))
	}

	serial := Serial(bob.Certificate.Leaf)
	deny.revoke(serial, "left the team")
	n := l.Disconnect(func(c *Conn) bool { return c.Serial() == serial }, "your certificate was revoked by admin")
	if n != 1 {
		t.Fatalf("Disconnect closed %d connections, want bob's one", n)
	}
	select {
	case <-bc.Context().Done():
	case <-ctx.Done():
		t.Fatal("bob's open connection survived the revocation")
	}
	wantErrContains(t, bc.Err(), "revoked by admin")
	if nc.Context().Err() != nil {
		t.Fatal("the node's connection was closed too")
	}

	// A new connection of bob is refused at once, with the reason.
	expectRefused(t, ctx, func() (*Conn, error) { return newDialer(t).DialClient(ctx, addr, bob) }, "was revoked: left the team")
	// Another viewer is not.
	carol, _ := a.IssueClient("carol", RoleViewer)
	cc, err := newDialer(t).DialClient(ctx, addr, carol)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if c := acceptOne(t, ctx, l); c.Name() != "carol" {
		t.Fatalf("accepted %q", c.Name())
	}
}

func TestInlineClientConfig(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	id, err := a.IssueClient("dave", RoleOperator)
	if err != nil {
		t.Fatal(err)
	}
	data, err := ClientConfigYAML(l.Addr().String(), id)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dave.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = LoadClientConfig(path)
	wantErrContains(t, err, "chmod 600")
	os.Chmod(path, 0o600)
	cfg, got, err := LoadClientConfig(path)
	if err != nil {
		t.Fatalf("LoadClientConfig: %v", err)
	}
	if got.Name != "dave" || got.Role != RoleOperator || cfg.Server != l.Addr().String() {
		t.Fatalf("loaded %s %q for %s", got.Role, got.Name, cfg.Server)
	}
	c, err := DialClient(ctx, cfg.Server, got)
	if err != nil {
		t.Fatalf("dial with the inline config: %v", err)
	}
	defer c.Close()
	if sc := acceptOne(t, ctx, l); sc.Name() != "dave" {
		t.Fatalf("server sees %q", sc.Name())
	}
}
