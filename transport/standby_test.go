package transport

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// siblingAuthority is a second server of a's cluster: the same CA and join
// secret (copied, as every server of a highly available control plane
// holds them), its own server certificate with its own names.
func siblingAuthority(t *testing.T, a *Authority, opts AuthorityOptions) *Authority {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{CACertFile, CAKeyFile, TokenSecretFile} {
		b, err := os.ReadFile(filepath.Join(a.dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	b, err := OpenAuthority(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDialAnotherServerOfTheCluster: a node that joined through one server
// dials another of the same cluster. Its identity pins the cluster CA, not
// a server, and the name checked is the host it dials, which the other
// server's own certificate must cover.
func TestDialAnotherServerOfTheCluster(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	la := startListener(t, a, ListenConfig{})
	id := joinNode(t, ctx, la, a, "gpu-1")

	b := siblingAuthority(t, a, AuthorityOptions{ServerNames: []string{"head-b.example"}})
	if a.ServerCertificate().Leaf.Equal(b.ServerCertificate().Leaf) {
		t.Fatal("the sibling server reuses the first server's certificate")
	}
	lb := startListener(t, b, ListenConfig{})
	_, port, _ := net.SplitHostPort(lb.Addr().String())
	for _, addr := range []string{lb.Addr().String(), "localhost:" + port} {
		c, err := newDialer(t).DialNode(ctx, addr, id)
		if err != nil {
			t.Fatalf("dial the other server at %s: %v", addr, err)
		}
		c.Close()
	}

	// The name is still checked: b's certificate covers head-b.example,
	// not a name of a's.
	tlsConf := clientTLS(ALPNNode, &id.Certificate, poolOf(a), nil, "head-a.invalid", time.Now)
	_, err := newDialer(t).dial(ctx, lb.Addr().String(), tlsConf)
	wantErrContains(t, err, `not valid for "head-a.invalid"`)

	// A server of another cluster is not trusted.
	lc := startListener(t, newAuthority(t, AuthorityOptions{}), ListenConfig{})
	_, err = newDialer(t).DialNode(ctx, lc.Addr().String(), id)
	wantErrContains(t, err, "not issued by this cluster's CA")
}

// TestJoinAtStandby: a standby sends the node on to the leader
// without using the token; with no leader elected the join is turned away
// as busy (worth retrying).
func TestJoinAtStandby(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	leader := startListener(t, a, ListenConfig{})
	leaderAddr := leader.Addr().String()
	b := siblingAuthority(t, a, AuthorityOptions{})
	var named string
	standby := startListener(t, b, ListenConfig{Standby: func() *NotLeaderError {
		return &NotLeaderError{Leader: named, Reason: "standby"}
	}})
	tok, _, err := a.CreateToken(time.Hour) // single use
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()

	named = leaderAddr
	_, err = newDialer(t).Join(ctx, standby.Addr().String(), tok, "gpu-1", dir)
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != leaderAddr || nl.Server != standby.Addr().String() {
		t.Fatalf("join at the standby: %v, want a *NotLeaderError naming %s", err, leaderAddr)
	}
	t.Logf("as reported: %v", err)

	named = ""
	_, err = newDialer(t).Join(ctx, standby.Addr().String(), tok, "gpu-1", dir)
	if !IsBusy(err) {
		t.Fatalf("join at a standby with no leader: %v, want busy", err)
	}
	t.Logf("as reported: %v", err)

	// The standby used nothing: the single-use token still joins at the
	// leader.
	if _, err := newDialer(t).Join(ctx, leaderAddr, tok, "gpu-1", dir); err != nil {
		t.Fatalf("join at the leader after the standby's redirect: %v", err)
	}
}
