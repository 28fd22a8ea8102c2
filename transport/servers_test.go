package transport

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseServers(t *testing.T) {
	tests := []struct {
		name    string
		in      []string
		want    []string
		wantErr string // part of the error; "" for none
	}{
		{"one address as today", []string{"10.0.0.1:7443"}, []string{"10.0.0.1:7443"}, ""},
		{"comma-separated", []string{"a:1,b:2,c:3"}, []string{"a:1", "b:2", "c:3"}, ""},
		{"space trimmed", []string{" a:1 ,  b:2\t"}, []string{"a:1", "b:2"}, ""},
		{"duplicates once, first place kept", []string{"a:1,b:2,a:1"}, []string{"a:1", "b:2"}, ""},
		{"YAML list entries", []string{"a:1", "b:2", "a:1"}, []string{"a:1", "b:2"}, ""},
		{"list entry holding a comma list", []string{"a:1,b:2", "c:3"}, []string{"a:1", "b:2", "c:3"}, ""},
		{"IPv6", []string{"[::1]:7443,[fd00::2]:7443"}, []string{"[::1]:7443", "[fd00::2]:7443"}, ""},
		{"empty", []string{""}, nil, "no server address"},
		{"nothing", nil, nil, "no server address"},
		{"only spaces", []string{"  "}, nil, "no server address"},
		{"empty entry between commas", []string{"a:1,,b:2"}, nil, `address 2 of 3 is empty`},
		{"trailing comma", []string{"a:1,"}, nil, `address 2 of 2 is empty`},
		{"missing port names the entry", []string{"a:1,b"}, nil, `server list "a:1,b": server address "b"`},
		{"bad port names the entry", []string{"a:1,b:99999"}, nil, `server address "b:99999": port "99999"`},
		{"missing host", []string{":7443"}, nil, `server address ":7443": missing host`},
		{"single bad address as today", []string{"nohost"}, nil, `server address "nohost"`},
		{"bad YAML list entry", []string{"a:1", "b"}, nil, `server list "b": server address "b"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseServers(tc.in...)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseServers(%q) = %v, %v; want an error containing %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ParseServers(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

// FuzzParseServers: whatever the input, the parser either refuses it or
// returns distinct addresses, each a valid host:port with no space around.
func FuzzParseServers(f *testing.F) {
	for _, s := range []string{"a:1", "a:1,b:2", " a:1 , a:1", "a:1,,b:2", "[::1]:7443", ":1", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseServers(in)
		if err != nil {
			return
		}
		if len(got) == 0 {
			t.Fatalf("ParseServers(%q) returned no address and no error", in)
		}
		for i, a := range got {
			if _, _, err := splitServer(a); err != nil || strings.TrimSpace(a) != a || strings.Contains(a, ",") {
				t.Fatalf("ParseServers(%q)[%d] = %q is not a clean host:port (%v)", in, i, a, err)
			}
			if slices.Index(got, a) != i {
				t.Fatalf("ParseServers(%q) repeats %q", in, a)
			}
		}
	})
}

// TestServersRotation drives the rotation through the outcomes a node or
// a client meets and checks the address each tries next and when a full
// round has failed.
func TestServersRotation(t *testing.T) {
	type step struct {
		op       string // "fail", "ok", "redirect:<to>"
		want     string // Next after the step
		roundEnd bool   // what fail returns
	}
	tests := []struct {
		name  string
		addrs []string
		steps []step
	}{
		{"one address: every failure is a round", []string{"a:1"}, []step{
			{"fail", "a:1", true}, {"fail", "a:1", true}, {"ok", "a:1", false}, {"fail", "a:1", true}}},
		{"failures go round, a round ends after each address failed", []string{"a:1", "b:1", "c:1"}, []step{
			{"fail", "b:1", false}, {"fail", "c:1", false}, {"fail", "a:1", true}, {"fail", "b:1", false}}},
		{"the one that answered is tried first", []string{"a:1", "b:1", "c:1"}, []step{
			{"fail", "b:1", false}, {"ok", "b:1", false}, {"fail", "c:1", false}, {"fail", "a:1", false}, {"fail", "b:1", true}}},
		{"redirect to a listed leader", []string{"a:1", "b:1", "c:1"}, []step{
			{"redirect:c:1", "c:1", false}, {"ok", "c:1", false}, {"fail", "a:1", false}}},
		{"a dead leader named by a standby: the round goes on after the standby", []string{"a:1", "b:1", "c:1"}, []step{
			{"redirect:c:1", "c:1", false}, {"fail", "b:1", false}, {"fail", "c:1", false}, {"fail", "a:1", true}}},
		{"a leader off the list", []string{"a:1", "b:1"}, []step{
			{"redirect:x:1", "x:1", false}, {"fail", "b:1", false}, {"fail", "a:1", true}}},
		{"a leader off the list that answered stays first", []string{"a:1", "b:1"}, []step{
			{"redirect:x:1", "x:1", false}, {"ok", "x:1", false}, {"fail", "b:1", false}}},
		{"standbys naming each other are cut off", []string{"a:1", "b:1"}, []step{
			{"redirect:b:1", "b:1", false}, {"redirect:a:1", "a:1", false}, {"redirect:b:1", "b:1", false},
			{"redirect refused:a:1", "b:1", false}, {"fail", "a:1", false}, {"redirect:b:1", "b:1", false}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServers(tc.addrs)
			if s.Next() != tc.addrs[0] {
				t.Fatalf("first try %q, want %q", s.Next(), tc.addrs[0])
			}
			for i, st := range tc.steps {
				cur := s.Next()
				switch {
				case st.op == "fail":
					if got := s.Failed(cur); got != st.roundEnd {
						t.Fatalf("step %d: Failed(%s) = %v, want %v", i, cur, got, st.roundEnd)
					}
				case st.op == "ok":
					s.Succeeded(cur)
				case strings.HasPrefix(st.op, "redirect refused:"):
					if s.Redirect(cur, strings.TrimPrefix(st.op, "redirect refused:")) {
						t.Fatalf("step %d: redirect from %s followed, want it refused", i, cur)
					}
				case strings.HasPrefix(st.op, "redirect:"):
					if !s.Redirect(cur, strings.TrimPrefix(st.op, "redirect:")) {
						t.Fatalf("step %d: redirect from %s refused", i, cur)
					}
				}
				if got := s.Next(); got != st.want {
					t.Fatalf("step %d (%s at %s): next %q, want %q", i, st.op, cur, got, st.want)
				}
			}
		})
	}
}

func TestServersRound(t *testing.T) {
	s := NewServers([]string{"a:1", "b:1", "c:1"})
	if got, want := s.Round(), []string{"a:1", "b:1", "c:1"}; !slices.Equal(got, want) {
		t.Fatalf("first round %q, want %q", got, want)
	}
	s.Succeeded("b:1")
	if got, want := s.Round(), []string{"b:1", "c:1", "a:1"}; !slices.Equal(got, want) {
		t.Fatalf("round after b answered %q, want %q", got, want)
	}
	s.Redirect("b:1", "x:1")
	if got, want := s.Round(), []string{"x:1", "c:1", "a:1", "b:1"}; !slices.Equal(got, want) {
		t.Fatalf("round after a redirect off the list %q, want %q", got, want)
	}
}

// fakeConn is what a fake dial connects: it says when it is closed.
type fakeConn struct {
	addr   string
	closed chan struct{}
}

func (c *fakeConn) Close() error { close(c.closed); return nil }

// TestDialRound: a server that never answers holds the round one stagger,
// not its dial timeout; one that fails at once hands over at once; what a
// losing dial connects late is closed; a whole round failed is recorded
// as one and names every server; a refusal ends the round.
func TestDialRound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	connect := func(addr string) (*fakeConn, error) { return &fakeConn{addr: addr, closed: make(chan struct{})}, nil }
	// silent never answers: its dial ends only when the round cancels it.
	cancelled := make(chan string, 8)
	silent := func(ctx context.Context, addr string) (*fakeConn, error) {
		<-ctx.Done()
		cancelled <- addr
		return nil, fmt.Errorf("dial %s: %w", addr, ctx.Err())
	}

	t.Run("silent first server", func(t *testing.T) {
		s := NewServers([]string{"dead:1", "live:2"})
		start := time.Now()
		c, addr, err := dialRound(ctx, s, 20*time.Millisecond, func(ctx context.Context, addr string) (*fakeConn, error) {
			if addr == "dead:1" {
				return silent(ctx, addr)
			}
			return connect(addr)
		})
		if err != nil || addr != "live:2" || c.addr != "live:2" {
			t.Fatalf("got %v %q %v, want the live server", c, addr, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("took %s", took)
		}
		if got := <-cancelled; got != "dead:1" {
			t.Fatalf("cancelled %q, want the dead server's dial", got)
		}
		if s.Next() != "live:2" {
			t.Fatalf("next %q, want the server that answered", s.Next())
		}
	})

	t.Run("a failure hands over at once", func(t *testing.T) {
		s := NewServers([]string{"refusing:1", "live:2"})
		// A stagger longer than the test: only the failure can start the
		// second dial.
		c, addr, err := dialRound(ctx, s, time.Hour, func(ctx context.Context, addr string) (*fakeConn, error) {
			if addr == "refusing:1" {
				return nil, errors.New("connection refused")
			}
			return connect(addr)
		})
		if err != nil || addr != "live:2" || c == nil {
			t.Fatalf("got %q %v, want the live server", addr, err)
		}
	})

	t.Run("a late connection of a loser is closed", func(t *testing.T) {
		s := NewServers([]string{"slow:1", "fast:2"})
		release := make(chan struct{})
		late := make(chan *fakeConn, 1)
		_, addr, err := dialRound(ctx, s, 10*time.Millisecond, func(ctx context.Context, addr string) (*fakeConn, error) {
			if addr == "slow:1" {
				<-release
				c, _ := connect(addr)
				late <- c
				return c, nil
			}
			return connect(addr)
		})
		if err != nil || addr != "fast:2" {
			t.Fatalf("got %q %v, want the fast server", addr, err)
		}
		close(release)
		select {
		case <-(<-late).closed:
		case <-ctx.Done():
			t.Fatal("the slow server's connection, made after the round was won, is left open")
		}
	})

	t.Run("a whole round failed", func(t *testing.T) {
		s := NewServers([]string{"a:1", "b:2", "c:3"})
		_, _, err := dialRound(ctx, s, time.Hour, func(ctx context.Context, addr string) (*fakeConn, error) {
			return nil, fmt.Errorf("dial %s: no answer", addr)
		})
		if err == nil || !strings.Contains(err.Error(), "no server of a:1,b:2,c:3 answered") {
			t.Fatalf("err %v, want every server named", err)
		}
		for _, a := range []string{"a:1", "b:2", "c:3"} {
			if !strings.Contains(err.Error(), "dial "+a) {
				t.Errorf("err %v does not say why %s failed", err, a)
			}
		}
		// Each failure recorded: the next round starts over at the first.
		if got := s.Next(); got != "a:1" {
			t.Errorf("after the failed round next is %q, want a:1", got)
		}
	})

	t.Run("a refusal ends the round", func(t *testing.T) {
		s := NewServers([]string{"a:1", "b:2"})
		var asked []string
		_, _, err := dialRound(ctx, s, time.Hour, func(ctx context.Context, addr string) (*fakeConn, error) {
			asked = append(asked, addr)
			return nil, &RefusedError{Reason: "certificate revoked"}
		})
		var refused *RefusedError
		if !errors.As(err, &refused) || len(asked) != 1 {
			t.Fatalf("err %v after asking %q, want the refusal after one server", err, asked)
		}
	})
}
