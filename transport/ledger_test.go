package transport

import (
	"context"
	"crypto/x509"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func TestJoinTokenUses(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	addr := l.Addr().String()
	join := func(tok, node string) error {
		_, err := newDialer(t).Join(ctx, addr, tok, node, t.TempDir())
		return err
	}

	single, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := join(single, "gpu-01"); err != nil {
		t.Fatalf("first join with a fresh token: %v", err)
	}
	err = join(single, "gpu-02")
	wantErrContains(t, err, "already used")
	wantErrContains(t, err, "gpu-01 at")
	var ref *RefusedError
	if !errors.As(err, &ref) {
		t.Fatalf("reuse not refused by the server: %v", err)
	}

	triple, rec, err := a.IssueToken(TokenOptions{TTL: time.Hour, Uses: 3, CreatedBy: "admin", Description: "rack r12"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.GetUses() != 3 || rec.GetCreatedBy() != "admin" || rec.GetDescription() != "rack r12" {
		t.Fatalf("record %v", rec)
	}
	for _, n := range []string{"r12-a", "r12-b", "r12-c"} {
		if err := join(triple, n); err != nil {
			t.Fatalf("join %s with a 3-use token: %v", n, err)
		}
	}
	wantErrContains(t, join(triple, "r12-d"), "allowed 3 join(s)")
}

// TestJoinTokenLastUseRace joins eight nodes at once with one single-use
// token: exactly one gets a certificate.
func TestJoinTokenLastUseRace(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		joined   int
		refusals []error
	)
	for i := range 8 {
		d, err := newDialerOn(nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		dir := t.TempDir()
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := d.Join(ctx, l.Addr().String(), tok, "race-"+string(rune('a'+i)), dir)
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				joined++
			} else {
				refusals = append(refusals, err)
			}
		}()
	}
	wg.Wait()
	if joined != 1 {
		t.Fatalf("%d nodes joined with a single-use token (refusals %v)", joined, refusals)
	}
	for _, err := range refusals {
		if !errors.Is(err, ErrTokenSpent) && !IsBusy(err) {
			// The refusal crosses the wire as text.
			wantErrContains(t, err, "already used")
		}
	}
}

func TestTokenRecordRefusals(t *testing.T) {
	a := newAuthority(t, AuthorityOptions{})
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.CheckToken(tok); err != nil {
		t.Fatalf("CheckToken of a fresh token: %v", err)
	}
	// Checking takes no use.
	if err := a.CheckToken(tok); err != nil {
		t.Fatalf("second CheckToken: %v", err)
	}
	p, _ := ParseToken(tok)
	if _, err := a.tokenLedger().UpdateToken(p.ID, func(rec *api.JoinToken) error {
		rec.RevokedUnixNano, rec.RevokedBy = time.Now().UnixNano(), "alice"
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	err = a.UseToken(tok, "gpu-01")
	if !errors.Is(err, ErrTokenRevoked) {
		t.Fatalf("UseToken of a revoked token: %v", err)
	}
	wantErrContains(t, err, "revoked at")
	wantErrContains(t, err, "by alice")

	// A ledger that never saw the token (a server restored from an older
	// backup) refuses it although its signature is good.
	a.SetTokenLedger(&memLedger{})
	err = a.CheckToken(tok)
	if !errors.Is(err, ErrTokenUnknown) {
		t.Fatalf("CheckToken with no record: %v", err)
	}
	wantErrContains(t, err, "no record of token")

	tests := []struct {
		name string
		opts TokenOptions
		want string
	}{
		{"zero ttl", TokenOptions{}, "not positive"},
		{"negative ttl", TokenOptions{TTL: -time.Hour}, "not positive"},
		{"under a second", TokenOptions{TTL: time.Millisecond}, "between 1s"},
		{"over a year", TokenOptions{TTL: 2 * maxTokenTTL}, "between 1s"},
		{"negative uses", TokenOptions{TTL: time.Hour, Uses: -1}, "uses"},
		{"too many uses", TokenOptions{TTL: time.Hour, Uses: maxTokenUses + 1}, "uses"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := a.IssueToken(tc.opts)
			wantErrContains(t, err, tc.want)
		})
	}
}

// TestJoinHooksSeeKeyAndCertificate: OnJoin learns the node's key before
// anything is issued, OnJoined the certificate before it is sent, and a
// refusal from OnJoin keeps the token's use.
func TestJoinHooksSeeKeyAndCertificate(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	var (
		mu     sync.Mutex
		keys   = map[string]string{}
		issued *x509.Certificate
	)
	l := startListener(t, a, ListenConfig{
		OnJoin: func(_ context.Context, info JoinInfo) error {
			mu.Lock()
			defer mu.Unlock()
			if k, ok := keys[info.Node]; ok && k != info.KeySHA256 {
				return errors.New("known with another key: remove it first")
			}
			return nil
		},
		OnJoined: func(_ context.Context, info JoinInfo, cert *x509.Certificate) error {
			mu.Lock()
			defer mu.Unlock()
			if info.KeySHA256 != KeySHA256(cert.PublicKey) {
				return errors.New("certificate for another key")
			}
			keys[info.Node], issued = info.KeySHA256, cert
			return nil
		},
	})
	tok, _, err := a.IssueToken(TokenOptions{TTL: time.Hour, Uses: 2})
	if err != nil {
		t.Fatal(err)
	}
	id, err := newDialer(t).Join(ctx, l.Addr().String(), tok, "gpu-01", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if issued == nil || Serial(issued) != Serial(id.Certificate.Leaf) {
		t.Fatalf("OnJoined saw %v, node holds %v", issued, id.Certificate.Leaf.SerialNumber)
	}
	// Same name, new key: refused, and the token's second use is kept.
	_, err = newDialer(t).Join(ctx, l.Addr().String(), tok, "gpu-01", t.TempDir())
	wantErrContains(t, err, "another key")
	if _, err := newDialer(t).Join(ctx, l.Addr().String(), tok, "gpu-02", t.TempDir()); err != nil {
		t.Fatalf("the refused join took the token's last use: %v", err)
	}
}
