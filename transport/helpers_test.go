package transport

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newAuthority(t *testing.T, opts AuthorityOptions) *Authority {
	t.Helper()
	a, err := OpenAuthority(t.TempDir(), opts)
	if err != nil {
		t.Fatalf("OpenAuthority: %v", err)
	}
	return a
}

func startListener(t *testing.T, a *Authority, cfg ListenConfig) *Listener {
	t.Helper()
	l, err := Listen(context.Background(), "127.0.0.1:0", a, cfg)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func newDialer(t *testing.T) *Dialer {
	t.Helper()
	d, err := NewDialer(nil)
	if err != nil {
		t.Fatalf("NewDialer: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// joinNode joins a node named name and returns its identity.
func joinNode(t *testing.T, ctx context.Context, l *Listener, a *Authority, name string) *Identity {
	t.Helper()
	tok, _, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatalf("CreateToken: %v", err)
	}
	id, err := newDialer(t).Join(ctx, l.Addr().String(), tok, name, t.TempDir())
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	return id
}

// acceptOne accepts the next connection on l.
func acceptOne(t *testing.T, ctx context.Context, l *Listener) *Conn {
	t.Helper()
	c, err := l.Accept(ctx)
	if err != nil {
		t.Fatalf("Accept: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// expectRefused dials with dial and checks that the server refuses the
// connection with a message containing want, whether the refusal arrives
// before the dial returns or right after.
func expectRefused(t *testing.T, ctx context.Context, dial func() (*Conn, error), want string) {
	t.Helper()
	c, err := dial()
	if err == nil {
		t.Cleanup(func() { c.Close() })
		select {
		case <-c.Context().Done():
		case <-ctx.Done():
			t.Fatalf("server did not refuse the connection")
		}
		err = c.Err()
	}
	var ref *RefusedError
	if !errors.As(err, &ref) {
		t.Fatalf("got error %v, want a *RefusedError", err)
	}
	if !strings.Contains(ref.Reason, want) {
		t.Fatalf("refusal %q does not mention %q", ref.Reason, want)
	}
	t.Logf("refusal as reported: %v", err)
}

func wantErrContains(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one containing %q", want)
	}
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not contain %q", err, want)
	}
	t.Logf("error as reported: %v", err)
}
