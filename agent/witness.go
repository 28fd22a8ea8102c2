package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// Peer lease: a node's ranks outlive a silent control plane. Besides the
// server's renewals, nodemon renews each attempt's lease from a round of
// vouches: it asks the attempt's witnesses (other nodes, named at launch)
// once a heartbeat, and a round a quorum of them answered yes extends the
// lease to the round's start plus the lease (scheduler/fencing has the
// rules and why they keep a rank from running beside a newer attempt). A
// witness answers yes until the server tells it the attempt is superseded
// (Supersede, or a fencing SignalRanks), and no from then on, for good:
// the book below is on disk before the server hears the acknowledgement.

// A removed node (its certificate revoked: gpuctl node remove) gets no
// vouch either: the server sends the revoked node certificates
// (DeniedPeers), the book keeps them with the superseded attempts, and a
// request from a peer whose certificate serial is among them is refused.
// The serial is the one the peer proved at the handshake, not a name it
// claims.

// witnessBook is what this node, as a witness, knows of superseded
// attempts and denied peers, and when it last vouched for each job.
type witnessBook struct {
	path string
	log  *slog.Logger
	// started bounds the last vouch given by an earlier nodemon on this
	// host, which kept no record of it: none came after this start.
	started time.Time

	mu         sync.Mutex
	superseded map[string]uint32 // job → highest attempt superseded
	denied     map[string]bool   // revoked certificate serials
	vouched    map[string]time.Time
}

// witnessFile is the layout of <data-dir>/superseded.json. Denied came
// later; a book without it denies no one.
type witnessFile struct {
	Version    int               `json:"version"`
	Superseded map[string]uint32 `json:"superseded"`
	Denied     []string          `json:"denied,omitempty"`
}

// openWitnessBook loads the book kept in dataDir. An unreadable book is an
// error, not an empty one: forgetting a superseded attempt would let its
// ranks be vouched for again.
func openWitnessBook(dataDir string, log *slog.Logger) (*witnessBook, error) {
	b := &witnessBook{path: filepath.Join(dataDir, "superseded.json"), log: log, started: time.Now(),
		superseded: map[string]uint32{}, denied: map[string]bool{}, vouched: map[string]time.Time{}}
	data, err := os.ReadFile(b.path)
	if errors.Is(err, os.ErrNotExist) {
		return b, nil
	}
	if err != nil {
		return nil, fmt.Errorf("witness book: %w", err)
	}
	f, err := parseWitnessFile(data)
	if err != nil {
		return nil, fmt.Errorf("witness book %s is damaged (%v): it lists the job attempts and the removed nodes this node must never vouch for; restore it from a backup, or remove it only once every job that ran in the cluster before has ended", b.path, err)
	}
	b.superseded = f.Superseded
	for _, serial := range f.Denied {
		b.denied[serial] = true
	}
	return b, nil
}

// parseWitnessFile reads superseded.json.
func parseWitnessFile(data []byte) (*witnessFile, error) {
	var f witnessFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("version %d, want 1", f.Version)
	}
	out := &witnessFile{Version: 1, Superseded: map[string]uint32{}}
	for job, a := range f.Superseded {
		if job == "" || a == 0 {
			return nil, fmt.Errorf("entry %q: %d is not a job and attempt", job, a)
		}
		out.Superseded[job] = a
	}
	for _, serial := range f.Denied {
		if serial == "" {
			return nil, errors.New("denied: an empty certificate serial")
		}
		out.Denied = append(out.Denied, serial)
	}
	return out, nil
}

// saveLocked writes the book; b.mu is held.
func (b *witnessBook) saveLocked() error {
	data, err := json.Marshal(witnessFile{Version: 1, Superseded: b.superseded, Denied: slices.Sorted(maps.Keys(b.denied))})
	if err != nil {
		return err
	}
	return writeFileAtomic(b.path, data)
}

// supersede records that job's attempts up to attempt are superseded and
// returns how long ago this node last vouched for the job (or started).
// The record is on disk when it returns.
func (b *witnessBook) supersede(job string, attempt uint32) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	last := b.started
	if v := b.vouched[job]; v.After(last) {
		last = v
	}
	ago := time.Since(last)
	if b.superseded[job] >= attempt {
		return ago, nil
	}
	b.superseded[job] = attempt
	if err := b.saveLocked(); err != nil {
		return 0, fmt.Errorf("record %s attempt %d superseded: %w", job, attempt, err)
	}
	return ago, nil
}

// deny replaces the denied certificate serials with the server's list;
// a changed list is on disk when it returns, so a nodemon restarted while
// no server answers still refuses a removed node.
func (b *witnessBook) deny(serials []string) error {
	next := map[string]bool{}
	for _, s := range serials {
		if s != "" {
			next[s] = true
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if maps.Equal(next, b.denied) {
		return nil
	}
	added := 0
	for s := range next {
		if !b.denied[s] {
			added++
		}
	}
	b.denied = next
	if err := b.saveLocked(); err != nil {
		return fmt.Errorf("record %d denied peers: %w", len(next), err)
	}
	if added > 0 {
		b.log.Info("the server named removed nodes; this node vouches for them no more", "denied", len(next), "new", added)
	}
	return nil
}

// isSuperseded reports whether the book holds job's attempt superseded.
func (b *witnessBook) isSuperseded(job string, attempt uint32) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return attempt <= b.superseded[job]
}

// answer is this node's vouch for each attempt of req, asked by the peer
// whose certificate has serial; an error when that certificate is denied.
func (b *witnessBook) answer(serial string, req *api.VouchRequest) (*api.VouchResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.denied[serial] {
		return nil, fmt.Errorf("certificate serial %s was revoked (its node was removed from the cluster): this node vouches for it no more", serial)
	}
	now := time.Now()
	resp := &api.VouchResponse{}
	for _, a := range req.GetAttempts() {
		v := &api.Vouch{Job: a.GetJob(), Attempt: a.GetAttempt()}
		if a.GetAttempt() <= b.superseded[a.GetJob()] {
			v.Superseded = true
		} else {
			v.Vouched = true
			b.vouched[a.GetJob()] = now
		}
		resp.Vouches = append(resp.Vouches, v)
	}
	return resp, nil
}

// maxVouchAttempts bounds one request: a node runs a few attempts.
const maxVouchAttempts = 256

// serveWitness answers other nodes' vouch requests until ctx ends.
func (b *witnessBook) serve(ctx context.Context, l *transport.PeerListener) {
	for {
		conn, err := l.Accept(ctx)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("peer listener stopped; this node vouches for no other", "err", err)
			}
			return
		}
		go b.serveConn(ctx, conn)
	}
}

func (b *witnessBook) serveConn(ctx context.Context, conn *transport.Conn) {
	defer conn.Close()
	for {
		st, err := conn.AcceptStream(ctx)
		if err != nil {
			return
		}
		go func() {
			defer st.CloseWrite()
			st.SetDeadline(time.Now().Add(5 * time.Second))
			var req api.VouchRequest
			err := st.Recv(&req)
			// One message is all a request stream carries: saying so frees
			// its slot in the asker's stream limit (a round a second would
			// use up 1,024 in 17 minutes).
			st.StopReading()
			if err != nil {
				b.log.Debug("bad vouch request", "peer", conn.Name(), "err", err)
				return
			}
			if len(req.GetAttempts()) > maxVouchAttempts {
				st.Cancel(0)
				return
			}
			resp, err := b.answer(conn.Serial(), &req)
			if err != nil {
				b.log.Info("refused a vouch", "peer", conn.Name(), "err", err)
				conn.CloseWithError(transport.CodeRefused, err.Error())
				return
			}
			if err := st.Send(resp); err != nil {
				b.log.Debug("answer vouch request", "peer", conn.Name(), "err", err)
			}
		}()
	}
}

// peerPortFile keeps the port of the peer listener, so a restarted
// nodemon answers at the address its peers were given at launch.
const peerPortFile = "peer-port"

// listenPeers opens the peer listener (Config.PeerListen); nil when off.
func (a *Agent) listenPeers(id *transport.Identity) (*transport.PeerListener, error) {
	addr := a.cfg.PeerListen
	switch addr {
	case "off":
		return nil, nil
	case "":
		addr = "0.0.0.0:0"
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--peer-listen %q: %w (want host:port, or off)", addr, err)
	}
	saved := filepath.Join(a.cfg.DataDir, peerPortFile)
	if port == "0" {
		if b, err := os.ReadFile(saved); err == nil {
			if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && p > 0 && p < 65536 {
				if l, err := transport.ListenPeers(net.JoinHostPort(host, strconv.Itoa(p)), id); err == nil {
					return l, nil
				}
			}
		}
	}
	l, err := transport.ListenPeers(addr, id)
	if err != nil {
		return nil, fmt.Errorf("--peer-listen: %w", err)
	}
	if port == "0" {
		p := l.Addr().(*net.UDPAddr).Port
		if err := writeFileAtomic(saved, []byte(strconv.Itoa(p)+"\n")); err != nil {
			a.log.Warn("keep the peer port; a restart may listen elsewhere", "err", err)
		}
	}
	return l, nil
}
