package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/controlplane/ha"
	"github.com/gpuctl/gpuctl/store/etcdembed"
	"github.com/gpuctl/gpuctl/store/etcdstore"
)

// haFlags are gpuctl serve's flags for a highly available control plane.
type haFlags struct {
	store                       string
	endpoints                   []string
	prefix                      string
	caFile, certFile, keyFile   string
	name                        string
	ttl                         time.Duration
	embedded                    bool
	memberName, memberDir       string
	peerListen, clientListen    string
	initialCluster, memberState string
}

func (h *haFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&h.store, "store", "bbolt", "bbolt (<data-dir>/state.db, one server) or etcd (several servers, one leads; see --etcd-endpoints)")
	f.StringSliceVar(&h.endpoints, "etcd-endpoints", nil, "etcd client URLs, comma-separated (with --store etcd), e.g. https://10.0.0.1:2379,https://10.0.0.2:2379")
	f.StringVar(&h.prefix, "etcd-prefix", "/gpuctl/", "etcd key prefix shared by this cluster's servers")
	f.StringVar(&h.caFile, "etcd-cacert", "", "CA bundle that signed etcd's certificates (TLS to etcd)")
	f.StringVar(&h.certFile, "etcd-cert", "", "client certificate for etcd (TLS to etcd)")
	f.StringVar(&h.keyFile, "etcd-key", "", "client key for etcd (TLS to etcd)")
	f.StringVar(&h.name, "name", "", "this server's name among the control plane's servers (default: the host name)")
	f.DurationVar(&h.ttl, "leader-ttl", ha.DefaultTTL, "how long a server's etcd session outlives its last keep-alive: a dead leader is replaced after at most this (whole seconds)")
	f.BoolVar(&h.embedded, "embedded-etcd", false, "run an etcd member inside this server (implies --store etcd); three servers with it make a three-member etcd")
	f.StringVar(&h.memberName, "etcd-name", "", "this server's etcd member name (default: --name)")
	f.StringVar(&h.memberDir, "etcd-data-dir", "", "where the embedded etcd member keeps its data (default <data-dir>/etcd)")
	f.StringVar(&h.peerListen, "etcd-peer-url", "http://127.0.0.1:2380", "the embedded member's peer URL (listened on and advertised)")
	f.StringVar(&h.clientListen, "etcd-client-url", "http://127.0.0.1:2379", "the embedded member's client URL (listened on and advertised)")
	f.StringVar(&h.initialCluster, "etcd-initial-cluster", "", "the embedded members at bootstrap, name=peer-url,… (default: this member alone)")
	f.StringVar(&h.memberState, "etcd-initial-cluster-state", "new", "new (bootstrap) or existing (join a running etcd)")
}

// enabled tells whether serve runs as one of several servers on etcd.
func (h *haFlags) enabled() bool { return h.store == "etcd" || h.embedded }

func (h *haFlags) check() error {
	switch h.store {
	case "bbolt", "etcd":
	default:
		return fmt.Errorf("serve: --store %q: use bbolt or etcd", h.store)
	}
	if h.store == "bbolt" && !h.embedded && len(h.endpoints) > 0 {
		return fmt.Errorf("serve: --etcd-endpoints needs --store etcd")
	}
	if h.store == "etcd" && !h.embedded && len(h.endpoints) == 0 {
		return fmt.Errorf("serve: --store etcd needs --etcd-endpoints (or --embedded-etcd to run a member here)")
	}
	return nil
}

// serveHA runs serve as one server of a highly available control plane:
// a standby until it wins the election, then the leader.
func serveHA(ctx context.Context, out io.Writer, cfg controlplane.Config, h haFlags, log *slog.Logger,
	onLeader func(context.Context, *controlplane.Server) error) error {
	if err := h.check(); err != nil {
		return err
	}
	name := h.name
	if name == "" {
		name, _ = os.Hostname()
	}
	endpoints := h.endpoints
	if h.embedded {
		member, err := startMember(ctx, cfg.DataDir, name, h)
		if err != nil {
			return err
		}
		defer member.Close()
		if len(endpoints) == 0 {
			endpoints = member.Endpoints()
		}
		fmt.Fprintf(out, "etcd member %s serving clients on %s\n", member.Name(), strings.Join(member.Endpoints(), ","))
	}
	ecfg, err := etcdstore.ClientConfig(endpoints, h.caFile, h.certFile, h.keyFile)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ecfg.Context = ctx
	// etcd's client logs every retry at info level; gpuctl says what matters.
	ecfg.Logger = zap.NewNop()
	cli, err := clientv3.New(ecfg)
	if err != nil {
		return fmt.Errorf("serve: connect to etcd %s: %w", strings.Join(endpoints, ","), err)
	}
	defer cli.Close()
	st, err := etcdstore.Open(ctx, cli, etcdstore.Options{Prefix: h.prefix, Log: log.With("part", "store")})
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	addr, err := advertised(cfg)
	if err != nil {
		return err
	}
	// Nodes and clients are sent to this address when it leads: the
	// server's certificate must name its host.
	if host, _, err := net.SplitHostPort(addr); err == nil {
		cfg.ExtraNames = append(cfg.ExtraNames, host)
	}
	return ha.Run(ctx, ha.Options{
		Server:    cfg,
		Store:     st,
		Member:    ha.Config{Client: cli, Prefix: h.prefix, Name: name, Addr: addr, TTL: h.ttl, Log: log.With("part", "ha")},
		StoreName: "etcd at " + strings.Join(endpoints, ","),
		OnStandby: func(a net.Addr) {
			fmt.Fprintf(out, "gpuctl serve %s standing by on %s (udp); etcd %s\n", name, a, strings.Join(endpoints, ","))
		},
		OnLeader: func(ctx context.Context, srv *controlplane.Server) error {
			fmt.Fprintf(out, "gpuctl serve %s leading on %s (udp); admin config %s\n", name, srv.Addr(), controlplane.AdminConfigPath(cfg.DataDir))
			return onLeader(ctx, srv)
		},
	})
}

// advertised is the address other servers send nodes and clients to:
// --advertise's first address, else --listen when it names a host.
func advertised(cfg controlplane.Config) (string, error) {
	list := strings.Split(cfg.AdvertiseAddr, ",")
	if a := strings.TrimSpace(list[0]); a != "" {
		for i, other := range list[1:] {
			if strings.TrimSpace(other) == cfg.Listen && a != cfg.Listen {
				return "", fmt.Errorf("serve: --advertise %s names this server's --listen %s as address %d of %d: with --store etcd this server's own address comes first (the others send nodes and clients to the first when it leads)", cfg.AdvertiseAddr, cfg.Listen, i+2, len(list))
			}
		}
		return a, nil
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return "", fmt.Errorf("serve: --listen %q: %w", cfg.Listen, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("serve: --listen %s binds every address: give --advertise host:port, the address the other servers send nodes and clients to", cfg.Listen)
	}
	return cfg.Listen, nil
}

// startMember starts the embedded etcd member.
func startMember(ctx context.Context, dataDir, name string, h haFlags) (*etcdembed.Member, error) {
	mname := h.memberName
	if mname == "" {
		mname = name
	}
	dir := h.memberDir
	if dir == "" {
		dir = filepath.Join(dataDir, "etcd")
	}
	initial := h.initialCluster
	if initial == "" {
		initial = mname + "=" + h.peerListen
	}
	m, err := etcdembed.Start(ctx, etcdembed.Config{Name: mname, DataDir: dir, ClientURLs: h.clientListen,
		PeerURLs: h.peerListen, InitialCluster: initial, ClusterState: h.memberState})
	if err != nil {
		return nil, fmt.Errorf("serve: --embedded-etcd: %w", err)
	}
	return m, nil
}
