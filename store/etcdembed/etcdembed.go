// Package etcdembed runs an etcd member inside the gpuctl serve process
// (gpuctl serve --embedded-etcd), so a small HA control plane needs no
// separate etcd deployment. Tests build their clusters on it too.
package etcdembed

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// TLS names the PEM files of a member's certificate, key and the CA that
// signs its peers and clients. Both the client and the peer port require a
// client certificate signed by CA.
type TLS struct {
	CAFile, CertFile, KeyFile string
}

// Config is one member of an etcd cluster.
type Config struct {
	// Name is the member's name in InitialCluster.
	Name string
	// DataDir holds the WAL and the database; created when missing.
	DataDir string
	// ClientURLs and PeerURLs are comma-separated URLs the member listens
	// on and advertises (http:// or https://).
	ClientURLs, PeerURLs string
	// InitialCluster is "name=peerURL,..." of every member at bootstrap.
	InitialCluster string
	// ClusterState is "new" to bootstrap or "existing" to join; ignored
	// once DataDir holds a member.
	ClusterState string
	// TLS, when set, serves both ports with mutual TLS.
	TLS *TLS

	// TickMs and ElectionMs are raft's heartbeat and election timeout
	// (etcd's defaults 100 and 1000 when 0).
	TickMs, ElectionMs uint
	// LogLevel is etcd's zap level ("error" when empty: etcd is chatty at
	// info); LogFile, when set, receives its log instead of stderr.
	LogLevel, LogFile string
	// AutoCompaction is how much history etcd keeps (periodic mode;
	// default 5m). Without compaction every overwritten job and pruned
	// event stays in the database until the 2 GiB quota makes it read-only.
	AutoCompaction string
	// ReadyTimeout bounds the wait for the member to join (default 60s).
	ReadyTimeout time.Duration
}

// Member is a running etcd member.
type Member struct {
	cfg Config
	e   *embed.Etcd
}

// ErrAddrInUse is returned by Start when a listen address is taken.
var ErrAddrInUse = errors.New("address already in use")

// Launch starts the member without waiting for it to join its cluster: the
// members of a new cluster must all be launched before any is ready.
func Launch(c Config) (*Member, error) {
	ec, err := c.embedConfig()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd member %s: create %s: %w", c.Name, c.DataDir, err)
	}
	e, err := embed.StartEtcd(ec)
	if err != nil {
		if strings.Contains(err.Error(), "address already in use") {
			return nil, fmt.Errorf("etcd member %s: %w: %v", c.Name, ErrAddrInUse, err)
		}
		return nil, fmt.Errorf("etcd member %s: start: %w", c.Name, err)
	}
	return &Member{cfg: c, e: e}, nil
}

// Start launches the member and waits until it has joined its cluster
// (which needs a quorum of members up) or ctx ends.
func Start(ctx context.Context, c Config) (*Member, error) {
	m, err := Launch(c)
	if err != nil {
		return nil, err
	}
	if err := m.WaitReady(ctx); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// WaitReady waits until the member serves clients.
func (m *Member) WaitReady(ctx context.Context) error {
	timeout := m.cfg.ReadyTimeout
	if timeout == 0 {
		timeout = time.Minute
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-m.e.Server.ReadyNotify():
		return nil
	case err := <-m.e.Err():
		return fmt.Errorf("etcd member %s: stopped before it was ready: %w", m.cfg.Name, err)
	case <-t.C:
		return fmt.Errorf("etcd member %s: not ready after %s (is a quorum of --initial-cluster up and reachable?)", m.cfg.Name, timeout)
	case <-ctx.Done():
		return fmt.Errorf("etcd member %s: %w", m.cfg.Name, ctx.Err())
	}
}

// Endpoints returns the client URLs the member advertises.
func (m *Member) Endpoints() []string { return splitURLs(m.cfg.ClientURLs) }

// Name returns the member's name.
func (m *Member) Name() string { return m.cfg.Name }

// IsRaftLeader reports whether this member leads raft now.
func (m *Member) IsRaftLeader() bool {
	return m.e.Server.Leader() == m.e.Server.MemberID()
}

// Close stops the member gracefully (it hands raft leadership over first).
func (m *Member) Close() { m.e.Close() }

// Kill stops the member as a crash would, as far as a process can do that
// to itself: raft stops at once without handing leadership over, then the
// listeners close. The WAL is kept, so a later Start on DataDir recovers.
func (m *Member) Kill() {
	m.e.Server.HardStop()
	// Close now finds raft stopped: it skips the leadership transfer and
	// closes the client and peer listeners.
	m.e.Close()
}

func (c Config) embedConfig() (*embed.Config, error) {
	ec := embed.NewConfig()
	ec.Name = c.Name
	ec.Dir = c.DataDir
	if c.TickMs != 0 {
		ec.TickMs = c.TickMs
	}
	if c.ElectionMs != 0 {
		ec.ElectionMs = c.ElectionMs
	}
	var err error
	if ec.ListenClientUrls, err = parseURLs("client", c.ClientURLs); err != nil {
		return nil, err
	}
	if ec.ListenPeerUrls, err = parseURLs("peer", c.PeerURLs); err != nil {
		return nil, err
	}
	ec.AdvertiseClientUrls, ec.AdvertisePeerUrls = ec.ListenClientUrls, ec.ListenPeerUrls
	if c.InitialCluster != "" {
		ec.InitialCluster = c.InitialCluster
	} else {
		ec.InitialCluster = ec.InitialClusterFromName(c.Name)
	}
	switch c.ClusterState {
	case "", embed.ClusterStateFlagNew:
		ec.ClusterState = embed.ClusterStateFlagNew
	case embed.ClusterStateFlagExisting:
		ec.ClusterState = embed.ClusterStateFlagExisting
	default:
		return nil, fmt.Errorf("etcd member %s: cluster state %q: want new or existing", c.Name, c.ClusterState)
	}
	ec.AutoCompactionMode = "periodic"
	ec.AutoCompactionRetention = c.AutoCompaction
	if ec.AutoCompactionRetention == "" {
		ec.AutoCompactionRetention = "5m"
	}
	ec.LogLevel = c.LogLevel
	if ec.LogLevel == "" {
		ec.LogLevel = "error"
	}
	if c.LogFile != "" {
		if err := os.MkdirAll(filepath.Dir(c.LogFile), 0o700); err != nil {
			return nil, fmt.Errorf("etcd member %s: log dir: %w", c.Name, err)
		}
		ec.LogOutputs = []string{c.LogFile}
	}
	if t := c.TLS; t != nil {
		for _, f := range []string{t.CAFile, t.CertFile, t.KeyFile} {
			if _, err := os.Stat(f); err != nil {
				return nil, fmt.Errorf("etcd member %s: TLS: %w", c.Name, err)
			}
		}
		ec.ClientTLSInfo.TrustedCAFile, ec.ClientTLSInfo.CertFile, ec.ClientTLSInfo.KeyFile = t.CAFile, t.CertFile, t.KeyFile
		ec.ClientTLSInfo.ClientCertAuth = true
		ec.PeerTLSInfo = ec.ClientTLSInfo
	}
	return ec, nil
}

func parseURLs(what, s string) ([]url.URL, error) {
	var out []url.URL
	for _, raw := range splitURLs(s) {
		u, err := url.Parse(raw)
		if err != nil || u.Host == "" {
			return nil, fmt.Errorf("etcd %s URL %q: want scheme://host:port", what, raw)
		}
		out = append(out, *u)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("etcd: no %s URL", what)
	}
	return out, nil
}

func splitURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}
