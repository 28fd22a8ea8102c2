// Package sshserve serves the console over SSH: one bubbletea program per
// session, every session fed by one shared watch (a feed.Hub), each
// acting through a client made for the identity and role of the key that
// authenticated it. Keys not listed in the authorized-keys file are
// refused during authentication, before any console starts.
package sshserve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/ssh"
	"charm.land/wish/v2"
	"charm.land/wish/v2/activeterm"
	"charm.land/wish/v2/bubbletea"
	"github.com/charmbracelet/colorprofile"
	gossh "golang.org/x/crypto/ssh"

	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui"
	"github.com/gpuctl/gpuctl/tui/feed"
)

// Factory makes the client a session acts through: requests carry user's
// identity and role, and the server checks that role on every request.
type Factory func(user string, role transport.Role) (*client.Client, error)

// Config configures a Server.
type Config struct {
	// Listen is the TCP address, e.g. ":2222".
	Listen string
	// HostKey is the host key file, created (ed25519) on first start.
	HostKey string
	// AuthorizedKeys is the authorized-keys file (see ParseAuthorizedKeys).
	AuthorizedKeys string
	Factory        Factory
	// Hub is the shared subscription every session's console is fed from.
	Hub *feed.Hub
	// ReadOnly hides every action in every session.
	ReadOnly bool
	Log      *slog.Logger
	// IdleTimeout ends a session nobody typed in for that long (0: never);
	// a screen that changes does not keep it open.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds the SSH handshake and authentication of a
	// new connection (0: DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MaxConnsPerAddr and MaxConns cap the connections held from one source
	// address and in all, logged in or not (0: the Default values); one
	// beyond them is closed at accept.
	MaxConnsPerAddr, MaxConns int
}

// A session redraws at most every frameEvery after its user's input, and
// every dataFrameEvery after the feed changes (nodes sample once a
// second), so twenty sessions cost the server a few times what none do.
const (
	frameEvery     = 100 * time.Millisecond
	dataFrameEvery = time.Second
)

// Server is the SSH console server.
type Server struct {
	cfg  Config
	keys *keyFile
	srv  *ssh.Server
	ln   *limitListener
	log  *slog.Logger
	// sessions are the open consoles, watched for key changes and idleness.
	sessions sessions
}

// New checks the configuration and the authorized-keys file and builds the
// server; Listen and Serve start it.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Factory == nil:
		return nil, errors.New("ssh console: no client factory")
	case cfg.Hub == nil:
		return nil, errors.New("ssh console: no feed")
	case cfg.AuthorizedKeys == "":
		return nil, errors.New("ssh console: --ssh-authorized-keys is required: list each key with its role (role=operator ssh-ed25519 AAAA… alice)")
	case cfg.HostKey == "":
		return nil, errors.New("ssh console: no host key path")
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxConnsPerAddr <= 0 {
		cfg.MaxConnsPerAddr = DefaultMaxConnsPerAddr
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = DefaultMaxConns
	}
	s := &Server{cfg: cfg, keys: &keyFile{path: cfg.AuthorizedKeys}, log: log}
	if _, err := s.keys.load(); err != nil {
		return nil, fmt.Errorf("ssh console: %w", err)
	}
	opts := []ssh.Option{
		wish.WithHostKeyPath(cfg.HostKey),
		wish.WithPublicKeyAuth(s.authorize),
		wish.WithMiddleware(
			bubbletea.MiddlewareWithProgramHandler(s.program),
			activeterm.Middleware(),
			s.logSessions,
		),
	}
	srv, err := wish.NewServer(opts...)
	if err != nil {
		return nil, fmt.Errorf("ssh console: %w", err)
	}
	srv.HandshakeTimeout = cfg.HandshakeTimeout
	srv.ConnectionFailedCallback = func(c net.Conn, err error) {
		s.log.Info("ssh console: connection ended before login", "remote", c.RemoteAddr().String(), "err", err)
	}
	s.srv = srv
	return s, nil
}

// authorize admits only keys listed in the authorized-keys file.
func (s *Server) authorize(ctx ssh.Context, pub ssh.PublicKey) bool {
	k, ok, err := s.keys.lookup(pub)
	if err != nil {
		s.log.Error("ssh console: authorized keys unreadable; refusing", "err", err)
		return false
	}
	if !ok {
		s.log.Warn("ssh console: key refused", "user", ctx.User(), "remote", ctx.RemoteAddr().String(),
			"fingerprint", fingerprint(pub))
		return false
	}
	s.log.Info("ssh console: key accepted", "name", k.Name, "role", string(k.Role), "remote", ctx.RemoteAddr().String())
	return true
}

func fingerprint(pub ssh.PublicKey) string {
	if pub == nil {
		return ""
	}
	return gossh.FingerprintSHA256(pub)
}

// program starts one console for a session, with the role of the key the
// session authenticated with (looked up again: the file may have changed).
func (s *Server) program(sess ssh.Session) *tea.Program {
	k, ok, err := s.keys.lookup(sess.PublicKey())
	if err != nil || !ok {
		wish.Fatalln(sess, "gpuctl: this key is not (or no longer) authorized for the console")
		return nil
	}
	cl, err := s.cfg.Factory(k.Name, k.Role)
	if err != nil {
		s.log.Error("ssh console: no client for session", "name", k.Name, "err", err)
		wish.Fatalln(sess, "gpuctl: cannot reach the control plane: "+err.Error())
		return nil
	}
	m := tui.New(tui.Options{Client: cl, Role: k.Role, User: k.Name + "@ssh", ReadOnly: s.cfg.ReadOnly, Log: s.log.With("ssh", k.Name),
		MinFrame: frameEvery, DataFrame: dataFrameEvery})
	open := &session{key: k, sess: sess}
	open.lastInput.Store(time.Now().UnixNano())
	// The filter replaces MakeOptions' own, which it includes.
	opts := append(bubbletea.MakeOptions(sess), tea.WithFilter(open.inputFilter))
	pty, _, hasPty := sess.Pty()
	var model tea.Model = m
	if hasPty {
		w, h := min(pty.Window.Width, maxWidth), min(pty.Window.Height, maxHeight)
		opts = append(opts, tea.WithWindowSize(w, h))
		// The console draws in the 256-colour palette only, so a terminal
		// with 256 colours or more shows its frames as they are, drawn a
		// line at a time (lineScreen); one with fewer needs bubbletea's
		// renderer, which converts each colour to the terminal's.
		if p := terminalProfile(sess, pty.Term); p == colorprofile.ANSI256 || p == colorprofile.TrueColor {
			open.scr = newScreen(sess, h, "gpuctl")
			model = &drawnBy{Model: m, scr: open.scr}
			// The program's frame rate now only paces its terminal queries:
			// sixty wake-ups a second a session for nothing is CPU.
			opts = append(opts, tea.WithoutRenderer(), tea.WithOutput(open.scr), tea.WithColorProfile(p), tea.WithFPS(1))
		}
	}
	p := tea.NewProgram(model, opts...)
	open.prog = p
	if hasPty {
		open.capped(pty.Window.Width, pty.Window.Height) // says so if it is capped
	}
	s.sessions.add(open)
	unsub := s.cfg.Hub.Subscribe(p.Send)
	go func() {
		<-sess.Context().Done()
		if open.scr != nil {
			open.scr.close()
		}
		s.sessions.remove(open)
		unsub()
		cl.Close()
	}()
	return p
}

// terminalProfile is the colour profile bubbletea would find for the
// session, found as wish finds it.
func terminalProfile(sess ssh.Session, term string) colorprofile.Profile {
	env := append(sess.Environ(), "TERM="+term)
	if sess.EmulatedPty() {
		return colorprofile.Env(env)
	}
	return colorprofile.Detect(sess, env)
}

func (s *Server) logSessions(next ssh.Handler) ssh.Handler {
	return func(sess ssh.Session) {
		start := time.Now()
		k, _, _ := s.keys.lookup(sess.PublicKey())
		s.log.Info("ssh console: session start", "name", k.Name, "role", string(k.Role), "remote", sess.RemoteAddr().String())
		next(sess)
		if open := s.sessions.of(sess); open != nil {
			if open.scr != nil {
				open.scr.close()
			}
			open.finish()
		}
		s.log.Info("ssh console: session end", "name", k.Name, "duration", time.Since(start).Round(time.Millisecond))
	}
}

// Listen binds the TCP address.
func (s *Server) Listen() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("ssh console: listen %s: %w", s.cfg.Listen, err)
	}
	s.ln = newLimitListener(ln, s.cfg.MaxConnsPerAddr, s.cfg.MaxConns, s.log)
	return nil
}

// Addr is the bound address (after Listen).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Serve accepts sessions until ctx ends, then closes every session.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if err := s.Listen(); err != nil {
			return err
		}
	}
	done := make(chan error, 1)
	go func() { done <- s.srv.Serve(s.ln) }()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go s.watch(wctx)
	select {
	case err := <-done:
		if errors.Is(err, ssh.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("ssh console: %w", err)
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.srv.Shutdown(sctx); err != nil {
			s.srv.Close()
		}
		<-done
		return nil
	}
}
