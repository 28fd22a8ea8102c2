package transport

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// TestJoinFloodBounded opens join connections from one address that never
// send a request: at most maxJoinsPerAddr of them hold a slot, the rest are
// turned away as busy at once, the holders are cut off after
// joinRequestTimeout, and a node from another address joins meanwhile.
func TestJoinFloodBounded(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	addr := l.Addr().String()
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pin, _ := ParseToken(tok)

	const flood = 3 * maxJoinsPerAddr
	type result struct {
		code    quic.ApplicationErrorCode
		msg     string
		after   time.Duration
		dialErr error
	}
	results := make(chan result, flood)
	var wg sync.WaitGroup
	start := time.Now()
	for range flood {
		d, err := newDialerOn(nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.dial(ctx, addr, clientTLS(ALPNJoin, nil, nil, &pin.CAHash, "127.0.0.1", time.Now))
			if err != nil {
				results <- result{dialErr: err, after: time.Since(start)}
				return
			}
			// Hold the slot: no stream, no request.
			<-c.Context().Done()
			var app *quic.ApplicationError
			r := result{after: time.Since(start)}
			if errors.As(context.Cause(c.Context()), &app) {
				r.code, r.msg = app.ErrorCode, app.ErrorMessage
			}
			results <- r
		}()
	}

	// While the flood holds its slots, a node on another address joins.
	deadline := time.Now().Add(joinRequestTimeout)
	for {
		l.mu.Lock()
		held := l.joins["127.0.0.1"]
		l.mu.Unlock()
		if held == maxJoinsPerAddr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the flood holds %d join slots, want %d", held, maxJoinsPerAddr)
		}
		time.Sleep(5 * time.Millisecond)
	}
	real, err := newDialerOn(nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { real.Close() })
	if _, err := real.Join(ctx, addr, tok, "gpu-real", t.TempDir()); err != nil {
		t.Fatalf("a node from another address could not join during the flood: %v", err)
	}
	joinedAfter := time.Since(start)

	wg.Wait()
	close(results)
	busy, timedOut := 0, 0
	for r := range results {
		switch {
		case r.dialErr != nil && IsBusy(r.dialErr), r.code == CodeBusy:
			busy++
			if r.after > joinRequestTimeout {
				t.Errorf("busy refusal came after %s, want at once", r.after)
			}
		case r.code == CodeProtocol:
			timedOut++
			if r.after > joinRequestTimeout+2*time.Second {
				t.Errorf("idle join held its slot for %s, want about %s", r.after, joinRequestTimeout)
			}
			wantErrContains(t, errors.New(r.msg), "no join request within 2s")
		default:
			t.Errorf("flood connection ended with code %d %q (dial err %v)", r.code, r.msg, r.dialErr)
		}
	}
	if timedOut > maxJoinsPerAddr || busy < flood-maxJoinsPerAddr {
		t.Fatalf("%d idle joins held a slot and %d were turned away; want at most %d holding", timedOut, busy, maxJoinsPerAddr)
	}
	t.Logf("flood of %d: %d turned away busy, %d cut off idle; the real node joined after %s", flood, busy, timedOut, joinedAfter.Round(time.Millisecond))

	// Once the flood is gone, its address may join again.
	if _, err := joinNodeFrom(t, ctx, l, a, "gpu-after", net.IPv4(127, 0, 0, 1)); err != nil {
		t.Fatalf("join from the flooding address after the flood: %v", err)
	}
}

func joinNodeFrom(t *testing.T, ctx context.Context, l *Listener, a *Authority, name string, ip net.IP) (*Identity, error) {
	t.Helper()
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDialerOn(nil, &net.UDPAddr{IP: ip})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d.Join(ctx, l.Addr().String(), tok, name, t.TempDir())
}
