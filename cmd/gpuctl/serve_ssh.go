package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/transport"
	"github.com/gpuctl/gpuctl/tui/feed"
	"github.com/gpuctl/gpuctl/tui/sshserve"
)

// sshConsoleFlags are gpuctl serve's (and demo's) console-over-SSH options.
type sshConsoleFlags struct {
	listen, authorizedKeys    string
	idleTimeout, handshake    time.Duration
	maxConnsPerAddr, maxConns int
}

// defaultSSHIdleTimeout ends a console nobody typed in for half an hour:
// long enough to watch a job, short enough that a forgotten terminal does
// not keep a role open.
const defaultSSHIdleTimeout = 30 * time.Minute

func (s *sshConsoleFlags) register(f *pflag.FlagSet, listenHelp string) {
	f.StringVar(&s.listen, "ssh-listen", "", listenHelp)
	f.StringVar(&s.authorizedKeys, "ssh-authorized-keys", "", "keys allowed into the SSH console, one per line with its role:\nrole=operator ssh-ed25519 AAAA… alice")
	f.DurationVar(&s.idleTimeout, "ssh-idle-timeout", defaultSSHIdleTimeout, "end an SSH console session nobody typed in for this long (0: never)")
	f.DurationVar(&s.handshake, "ssh-handshake-timeout", sshserve.DefaultHandshakeTimeout, "close an SSH connection that has not logged in within this time")
	f.IntVar(&s.maxConnsPerAddr, "ssh-max-conns-per-addr", sshserve.DefaultMaxConnsPerAddr, "SSH connections held from one source address, logged in or not; more are closed at once")
	f.IntVar(&s.maxConns, "ssh-max-conns", sshserve.DefaultMaxConns, "SSH connections held in all, logged in or not; more are closed at once")
}

// startSSHConsole serves the console over SSH next to the control plane
// until ctx ends: one shared watch for every session, and per session a
// client with the identity and role of the key that logged in.
func startSSHConsole(ctx context.Context, f sshConsoleFlags, srv *controlplane.Server, dataDir string, log *slog.Logger) (net.Addr, error) {
	factory := selfClientFactory(ctx, srv)
	feedClient, err := factory("ssh-console", transport.RoleViewer)
	if err != nil {
		return nil, fmt.Errorf("ssh console: %w", err)
	}
	hub := feed.New(feedClient, feed.Options{Log: log})
	ss, err := sshserve.New(sshserve.Config{Listen: f.listen, AuthorizedKeys: f.authorizedKeys,
		HostKey: filepath.Join(dataDir, "ssh_host_ed25519_key"), Factory: factory, Hub: hub, Log: log,
		IdleTimeout: f.idleTimeout, HandshakeTimeout: f.handshake, MaxConnsPerAddr: f.maxConnsPerAddr, MaxConns: f.maxConns})
	if err != nil {
		feedClient.Close()
		return nil, err
	}
	if err := ss.Listen(); err != nil {
		feedClient.Close()
		return nil, err
	}
	srv.SetSSHKeys(sshKeyLister(f.authorizedKeys))
	go func() {
		defer feedClient.Close()
		if err := hub.Run(ctx); err != nil {
			log.Error("ssh console: watch ended", "err", err)
		}
	}()
	go func() {
		if err := ss.Serve(ctx); err != nil {
			log.Error("ssh console stopped", "err", err)
		}
	}()
	return ss.Addr(), nil
}

// selfClientFactory makes clients of this server for SSH sessions: the
// server's in-process transport acting as the session's key (its name and
// role), so every request goes through the same authorization and audit
// as any other client's.
func selfClientFactory(_ context.Context, srv *controlplane.Server) sshserve.Factory {
	return func(user string, role transport.Role) (*client.Client, error) {
		return client.New(srv.Local(controlplane.Caller{Name: user, Role: role, Via: "ssh"})), nil
	}
}

// sshKeyLister reads the SSH console's authorized-keys file for
// `gpuctl user list`.
func sshKeyLister(path string) controlplane.SSHKeyLister {
	return func() (string, []*api.SSHKey, error) {
		keys, err := sshserve.ReadAuthorizedKeys(path)
		out := make([]*api.SSHKey, 0, len(keys))
		for _, k := range keys {
			out = append(out, &api.SSHKey{Name: k.Name, Role: string(k.Role), Fingerprint: k.Fingerprint, Line: int32(k.Line)})
		}
		return path, out, err
	}
}
