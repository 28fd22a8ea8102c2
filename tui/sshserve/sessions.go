package sshserve

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	tea "charm.land/bubbletea/v2"
	"charm.land/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/gpuctl/gpuctl/tui/app"
)

// watchEvery is how often the authorized-keys file and the sessions' idle
// times are checked: a key removed from the file ends its sessions within
// about this long.
const watchEvery = time.Second

// session is one open console: the key it logged in with, as the file
// said then, and when its user last typed.
type session struct {
	key       Key
	sess      ssh.Session
	prog      *tea.Program
	scr       *lineScreen  // nil when bubbletea's renderer draws it
	lastInput atomic.Int64 // unix nanoseconds
	ending    atomic.Bool
	why       atomic.Value // string: why the server ended it
}

// sessions are the open consoles, so a change of the authorized-keys file
// or an idle timeout can end them.
type sessions struct {
	mu   sync.Mutex
	open map[*session]struct{}
}

func (ss *sessions) add(s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.open == nil {
		ss.open = map[*session]struct{}{}
	}
	ss.open[s] = struct{}{}
}

func (ss *sessions) remove(s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.open, s)
}

// of is the open console of sess, or nil.
func (ss *sessions) of(sess ssh.Session) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for s := range ss.open {
		if s.sess == sess {
			return s
		}
	}
	return nil
}

func (ss *sessions) list() []*session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	out := make([]*session, 0, len(ss.open))
	for s := range ss.open {
		out = append(out, s)
	}
	return out
}

// inputFilter records every key, paste and mouse event as input, and keeps
// a client's suspend (ctrl+z) from stopping the server's program, as
// wish's own filter does.
func (s *session) inputFilter(_ tea.Model, msg tea.Msg) tea.Msg {
	switch m := msg.(type) {
	case tea.SuspendMsg:
		return tea.ResumeMsg{}
	case tea.KeyPressMsg, tea.PasteMsg, tea.MouseMsg:
		s.lastInput.Store(time.Now().UnixNano())
	case tea.WindowSizeMsg:
		return s.capSize(m)
	}
	return msg
}

// Largest terminal a session draws: the renderer keeps cells for the
// whole screen, so a 1000×1000 PTY would cost hundreds of MB per session.
const maxWidth, maxHeight = 500, 200

// capSize draws a terminal larger than maxWidth×maxHeight at that size,
// and says so in the status line.
func (s *session) capSize(msg tea.WindowSizeMsg) tea.Msg {
	w, h := s.capped(msg.Width, msg.Height)
	return tea.WindowSizeMsg{Width: w, Height: h}
}

// capped is the size drawn for a w×h terminal; when it is smaller it
// says so in the status line.
func (s *session) capped(w, h int) (int, int) {
	cw, ch := min(w, maxWidth), min(h, maxHeight)
	if cw != w || ch != h {
		// Not Send from inside the program's loop: its channel is unbuffered.
		go s.prog.Send(app.FlashMsg{Text: fmt.Sprintf("terminal %d×%d is larger than %d×%d: drawing %d×%d", w, h, maxWidth, maxHeight, cw, ch), Err: true})
	}
	return cw, ch
}

// end stops the session's console; Server.logSessions then tells its
// user why and closes the connection, so the key cannot open another
// session on it unchecked.
func (s *session) end(why string) {
	if !s.ending.CompareAndSwap(false, true) {
		return
	}
	s.why.Store(why)
	s.prog.Quit()
	go func() {
		select {
		case <-s.sess.Context().Done():
		case <-time.After(2 * time.Second):
			s.prog.Kill()
		}
	}()
}

// finish tells the user why their session was ended and closes its
// connection, after the console has left the alternate screen so the
// reason is the last thing on their terminal. It does nothing for a
// session its user left.
func (s *session) finish() {
	why, _ := s.why.Load().(string)
	if why == "" {
		return
	}
	fmt.Fprintf(s.sess.Stderr(), "gpuctl: %s\r\n", why)
	_ = s.sess.Exit(1)
	if c, ok := s.sess.Context().Value(ssh.ContextKeyConn).(gossh.Conn); ok {
		c.Close()
	}
}

// watch ends, every watchEvery until ctx ends, the sessions whose key has
// left the authorized-keys file or changed role (a new login takes the new
// role), and those nobody typed in for the idle timeout.
func (srv *Server) watch(ctx context.Context) {
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			srv.check(now)
		}
	}
}

func (srv *Server) check(now time.Time) {
	keys, err := srv.keys.load()
	if err != nil {
		srv.log.Error("ssh console: authorized keys unreadable; ending every session", "err", err)
	}
	for _, s := range srv.sessions.list() {
		k, listed := keys[s.key.Fingerprint]
		switch {
		case err != nil:
			s.end("the authorized-keys file cannot be read: session ended")
		case !listed:
			srv.log.Warn("ssh console: key removed; session ended", "name", s.key.Name, "fingerprint", s.key.Fingerprint)
			s.end("this key was removed from the authorized keys: session ended")
		case k.Role != s.key.Role:
			srv.log.Warn("ssh console: key's role changed; session ended", "name", s.key.Name, "was", string(s.key.Role), "now", string(k.Role))
			s.end(fmt.Sprintf("this key's role changed from %s to %s: log in again to act as %s", s.key.Role, k.Role, k.Role))
		case srv.cfg.IdleTimeout > 0 && now.Sub(time.Unix(0, s.lastInput.Load())) >= srv.cfg.IdleTimeout:
			srv.log.Info("ssh console: idle session ended", "name", s.key.Name, "idle", srv.cfg.IdleTimeout)
			s.end(fmt.Sprintf("nothing typed for %s (--ssh-idle-timeout): session ended", srv.cfg.IdleTimeout))
		}
	}
}
