package main

import (
	"crypto/ed25519"
	"crypto/rand"

	"bytes"
	"context"
	"encoding/json"
	"errors"
	gossh "golang.org/x/crypto/ssh"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane"
	"github.com/gpuctl/gpuctl/internal/servertest"
	"github.com/gpuctl/gpuctl/transport"
)

// newRoot is gpuctl's command tree, as main builds it.
func newRoot() *cobra.Command { return newRootCmd() }

// gpuctl runs one gpuctl command line in this process.
func gpuctl(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errb)
	err = root.ExecuteContext(ctx)
	return out.String(), errb.String(), err
}

// mustGpuctl runs a command line that must succeed.
func mustGpuctl(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := gpuctl(t, args...)
	if err != nil {
		t.Fatalf("gpuctl %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// startServer runs a control plane on loopback in dir and returns it with
// the path of its admin config.
func startServer(t *testing.T, dir string) (*controlplane.Server, string) {
	t.Helper()
	return servertest.Start(t, controlplane.Config{DataDir: dir}), controlplane.AdminConfigPath(dir)
}

// TestUserAddViewerThenRevoke: a viewer added with `gpuctl user add` may
// look but not act; once `gpuctl user revoke` runs, its open connection is
// closed and a new one is refused with the reason.
func TestUserAddViewerThenRevoke(t *testing.T) {
	_, admin := startServer(t, t.TempDir())
	dir := t.TempDir()
	bob := filepath.Join(dir, "bob.yaml")
	mustGpuctl(t, "user", "add", "bob", "--role", "viewer", "-o", bob, "--config", admin)
	for _, f := range []string{"bob.yaml", "bob.crt", "bob.key", "ca.crt"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("user add -o did not write %s: %v", f, err)
		}
	}
	mustGpuctl(t, "nodes", "--config", bob)
	_, _, err := gpuctl(t, "cordon", "node-01", "--reason", "test", "--config", bob)
	if err == nil || !strings.Contains(err.Error(), "permission denied") || !strings.Contains(err.Error(), "needs the operator role") {
		t.Fatalf("viewer cordon: %v, want permission denied", err)
	}

	// Identities and tokens are the admin's alone.
	for _, args := range [][]string{{"user", "list"}, {"user", "add", "eve", "--role", "admin"}, {"token", "create"}, {"token", "list"}, {"node", "remove", "x"}} {
		_, _, err := gpuctl(t, append(args, "--config", bob)...)
		if err == nil || !strings.Contains(err.Error(), "needs the admin role") {
			t.Errorf("viewer: gpuctl %s: %v, want permission denied", strings.Join(args, " "), err)
		}
	}

	// An open connection of bob's, as a console would keep.
	ctx := context.Background()
	open, err := client.Dial(ctx, bob)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Nodes(ctx); err != nil {
		t.Fatal(err)
	}

	var listed struct {
		Identities []struct{ Name, Role, Serial string }
	}
	if err := json.Unmarshal([]byte(mustGpuctl(t, "user", "list", "-o", "json", "--config", admin)), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.Identities) != 2 || listed.Identities[0].Name != "admin" || listed.Identities[1].Name != "bob" || listed.Identities[1].Role != "viewer" {
		t.Fatalf("user list: %+v", listed.Identities)
	}

	out := mustGpuctl(t, "user", "revoke", "bob", "--reason", "left\x1b[2J the team", "--config", admin)
	if !strings.Contains(out, "revoked bob (viewer, serial "+listed.Identities[1].Serial+")") || !strings.Contains(out, "closed 1 open connection") {
		t.Fatalf("user revoke printed:\n%s", out)
	}
	// The client redials a closed connection, so its next request meets
	// the handshake's refusal rather than the close message.
	if _, err := open.Nodes(ctx); err == nil || !strings.Contains(err.Error(), "revoked") || !strings.Contains(err.Error(), "by admin (left[2J the team)") {
		t.Fatalf("bob's open connection after the revocation: %v", err)
	}
	_, _, err = gpuctl(t, "nodes", "--config", bob)
	var ref *transport.RefusedError
	if !errors.As(err, &ref) || !strings.Contains(err.Error(), `certificate of user "bob"`) || !strings.Contains(err.Error(), "was revoked at") ||
		!strings.Contains(err.Error(), "by admin (left[2J the team)") {
		t.Fatalf("bob connecting after the revocation: %v", err)
	}
	t.Logf("refusal as bob sees it: %v", err)
	if strings.Contains(mustGpuctl(t, "user", "list", "--config", admin), "bob") == false {
		t.Fatal("revoked user vanished from the list")
	}
	// The name is free again, with a new certificate.
	mustGpuctl(t, "user", "add", "bob", "--role", "operator", "-o", filepath.Join(t.TempDir(), "bob2.yaml"), "--config", admin)
	_, _, err = gpuctl(t, "user", "add", "bob", "--role", "viewer", "-o", filepath.Join(t.TempDir(), "bob3.yaml"), "--config", admin)
	if err == nil || !strings.Contains(err.Error(), `user "bob" exists`) {
		t.Fatalf("second live bob: %v", err)
	}
	_, _, err = gpuctl(t, "user", "revoke", "admin", "--config", admin)
	if err == nil || !strings.Contains(err.Error(), "the certificate this request came with") {
		t.Fatalf("admin revoking itself: %v", err)
	}
}

// TestUserAddPrintsConfig: without -o, the config is printed with the key
// inline, and works once stored with mode 600.
func TestUserAddPrintsConfig(t *testing.T) {
	_, admin := startServer(t, t.TempDir())
	out := mustGpuctl(t, "user", "add", "carol", "--role", "operator", "--config", admin)
	for _, want := range []string{"server: 127.0.0.1:", "ca_data: |", "cert_data: |", "key_data: |", "BEGIN PRIVATE KEY"} {
		if !strings.Contains(out, want) {
			t.Fatalf("printed config lacks %q:\n%s", want, out)
		}
	}
	path := filepath.Join(t.TempDir(), "carol.yaml")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	mustGpuctl(t, "nodes", "--config", path)
}

// TestTokenCommands: tokens are single-use unless made with --uses, a zero
// or negative --ttl is refused, and a revoked token admits nobody.
func TestTokenCommands(t *testing.T) {
	srv, admin := startServer(t, t.TempDir())
	addr := srv.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	join := func(tok, node string) error {
		_, err := transport.Join(ctx, addr, tok, node, t.TempDir())
		return err
	}
	for _, ttl := range []string{"0s", "-1h"} {
		_, _, err := gpuctl(t, "token", "create", "--ttl", ttl, "--config", admin)
		if err == nil || !strings.Contains(err.Error(), "is not positive") {
			t.Errorf("token create --ttl %s: %v, want a refusal", ttl, err)
		}
	}
	// The server refuses it too, whatever the client: here the request
	// sent as is, past the client's own check.
	c, err := client.Dial(ctx, admin)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Transport().Call(ctx, &api.ClientRequest{Body: &api.ClientRequest_CreateJoinToken{CreateJoinToken: &api.CreateJoinTokenRequest{TtlSeconds: -3600}}},
		func(r *api.ClientResponse) error {
			if r.GetError() != "" {
				return errors.New(r.GetError())
			}
			return nil
		})
	if err == nil || !strings.Contains(err.Error(), "not positive") {
		t.Errorf("server accepted a token with a negative lifetime: %v", err)
	}

	single := strings.TrimSpace(mustGpuctl(t, "token", "create", "--ttl", "1h", "--config", admin))
	if err := join(single, "gpu-01"); err != nil {
		t.Fatalf("join with a fresh token: %v", err)
	}
	if err := join(single, "gpu-02"); err == nil || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("reused single-use token: %v", err)
	}
	shared := strings.TrimSpace(mustGpuctl(t, "token", "create", "--uses", "2", "--description", "rack\tr12", "--config", admin))
	for _, n := range []string{"r12-a", "r12-b"} {
		if err := join(shared, n); err != nil {
			t.Fatalf("join %s with a 2-use token: %v", n, err)
		}
	}
	if err := join(shared, "r12-c"); err == nil || !strings.Contains(err.Error(), "allowed 2 join(s)") {
		t.Fatalf("third join with a 2-use token: %v", err)
	}
	spare := strings.TrimSpace(mustGpuctl(t, "token", "create", "--config", admin))
	p, _ := transport.ParseToken(spare)
	if out := mustGpuctl(t, "token", "revoke", p.ID, "--config", admin); !strings.Contains(out, "token "+p.ID+" revoked") {
		t.Fatalf("token revoke printed %q", out)
	}
	if err := join(spare, "gpu-09"); err == nil || !strings.Contains(err.Error(), "revoked at") {
		t.Fatalf("join with a revoked token: %v", err)
	}

	var listed struct {
		Tokens []struct {
			ID, State, Description string
			Used                   []struct{ Node string }
		}
	}
	if err := json.Unmarshal([]byte(mustGpuctl(t, "token", "list", "-o", "json", "--config", admin)), &listed); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	for _, tk := range listed.Tokens {
		states[tk.ID] = tk.State
		if tk.Description == "rack r12" && (len(tk.Used) != 2 || tk.Used[0].Node != "r12-a") {
			t.Errorf("shared token's uses: %+v", tk.Used)
		}
	}
	if sp, _ := transport.ParseToken(single); states[sp.ID] != "used" || states[p.ID] != "revoked" {
		t.Fatalf("token states %v", states)
	}
}

// TestNodeRemove: a join under a known node's name with another key is
// refused until `gpuctl node remove`; removal disconnects the node, its old
// certificate is refused from then on, and the name joins again.
func TestNodeRemove(t *testing.T) {
	srv, admin := startServer(t, t.TempDir())
	addr := srv.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token := func() string { return strings.TrimSpace(mustGpuctl(t, "token", "create", "--config", admin)) }
	id, err := transport.Join(ctx, addr, token(), "gpu-01", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	first := registerNode(t, ctx, srv, id)
	first.Close()
	waitNode(t, srv, "gpu-01", func(n *api.NodeStatus) bool { return !n.GetConnected() })

	// A reinstalled host (a new key) under the name of a node that is down.
	_, err = transport.Join(ctx, addr, token(), "gpu-01", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "known to this cluster with another key") || !strings.Contains(err.Error(), "gpuctl node remove gpu-01") {
		t.Fatalf("join under a known name with another key: %v", err)
	}

	// --confirm-fenced is refused, and removes nothing, for a node no job
	// waits for and for a connected one.
	if _, _, err := gpuctl(t, "node", "remove", "gpu-01", "--confirm-fenced", "--config", admin); err == nil || !strings.Contains(err.Error(), "no job waits for node gpu-01 to be fenced: remove it without --confirm-fenced") {
		t.Fatalf("confirm-fenced with no fence pending: %v", err)
	}
	conn := registerNode(t, ctx, srv, id)
	if _, _, err := gpuctl(t, "node", "remove", "gpu-01", "--confirm-fenced", "--config", admin); err == nil || !strings.Contains(err.Error(), "node gpu-01 is connected") {
		t.Fatalf("confirm-fenced of a connected node: %v", err)
	}
	if conn.Err() != nil {
		t.Fatalf("a refused --confirm-fenced disconnected the node: %v", conn.Err())
	}
	out := mustGpuctl(t, "node", "remove", "gpu-01", "--reason", "reinstalled", "--config", admin)
	if !strings.Contains(out, "node gpu-01 removed (it was connected and has been disconnected)") || !strings.Contains(out, "revoked certificate serial "+transport.Serial(id.Certificate.Leaf)) {
		t.Fatalf("node remove printed:\n%s", out)
	}
	select {
	case <-conn.Context().Done():
	case <-ctx.Done():
		t.Fatal("the removed node's connection stayed open")
	}
	if err := conn.Err(); err == nil || !strings.Contains(err.Error(), "node removed from the cluster by admin (reinstalled)") {
		t.Fatalf("removed node told: %v", err)
	}
	for _, n := range srv.Nodes() {
		if n.GetRegistration().GetName() == "gpu-01" {
			t.Fatalf("removed node still listed: %v", n)
		}
	}
	c, err := transport.DialNode(ctx, addr, id)
	if err == nil {
		<-c.Context().Done()
		err = c.Err()
	}
	if err == nil || !strings.Contains(err.Error(), `node "gpu-01" was removed from the cluster`) {
		t.Fatalf("old certificate after removal: %v", err)
	}
	t.Logf("refusal as the removed node sees it: %v", err)
	if _, err := transport.Join(ctx, addr, token(), "gpu-01", t.TempDir()); err != nil {
		t.Fatalf("join again after removal: %v", err)
	}
	if _, _, err := gpuctl(t, "node", "remove", "gpu-77", "--config", admin); err == nil || !strings.Contains(err.Error(), "no node called") {
		t.Fatalf("remove of an unknown node: %v", err)
	}
}

// registerNode connects as a node and registers, as nodemon does.
func registerNode(t *testing.T, ctx context.Context, srv *controlplane.Server, id *transport.Identity) *transport.Conn {
	addr := srv.Addr().String()
	t.Helper()
	conn, err := transport.DialNode(ctx, addr, id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	st, err := conn.OpenStream(ctx, transport.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&api.AgentMessage{Body: &api.AgentMessage_Hello{Hello: &api.Hello{Version: api.CurrentVersion(), Role: "node"}}}); err != nil {
		t.Fatal(err)
	}
	var w api.ServerMessage
	if err := st.Recv(&w); err != nil || w.GetWelcome().GetError() != "" {
		t.Fatalf("welcome: %v %v", &w, err)
	}
	if err := st.Send(&api.AgentMessage{Body: &api.AgentMessage_Register{Register: &api.NodeRegistration{Name: id.Name, HeartbeatIntervalMs: 60_000}}}); err != nil {
		t.Fatal(err)
	}
	waitNode(t, srv, id.Name, func(n *api.NodeStatus) bool { return n.GetConnected() })
	return conn
}

// waitNode polls until the server's view of node satisfies ok.
func waitNode(t *testing.T, srv *controlplane.Server, node string, ok func(*api.NodeStatus) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, n := range srv.Nodes() {
			if n.GetRegistration().GetName() == node && ok(n) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not as expected within 10s: %v", node, srv.Nodes())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestUserListShowsSSHKeys: with the SSH console on, `gpuctl user list`
// shows its keys beside the certificate users, as the authorized-keys file
// has them now (the file is their one owner), and says how one is revoked;
// a key deleted from the file is gone from the list at once, and a file
// that cannot be parsed is said to let no key in.
func TestUserListShowsSSHKeys(t *testing.T) {
	dir := t.TempDir()
	srv, admin := startServer(t, dir)
	keys := filepath.Join(dir, "authorized_keys")
	pub := func(name string) string {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		sp, err := gossh.NewPublicKey(priv.Public())
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(sp))) + " " + name
	}
	alice, carol := pub("alice"), pub("carol")
	if err := os.WriteFile(keys, []byte("# console keys\nrole=operator "+alice+"\nrole=viewer "+carol+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv.SetSSHKeys(sshKeyLister(keys))
	out := mustGpuctl(t, "user", "list", "--config", admin)
	for _, want := range []string{"admin", "SSH console keys, from " + keys, "revoke one by deleting its line", "alice", "operator", "carol", "viewer", "SHA256:"} {
		if !strings.Contains(out, want) {
			t.Fatalf("user list lacks %q:\n%s", want, out)
		}
	}
	var listed struct {
		SSHKeys []struct {
			Name, Role, Fingerprint, File string
			Line                          int
		} `json:"ssh_keys"`
	}
	if err := json.Unmarshal([]byte(mustGpuctl(t, "user", "list", "-o", "json", "--config", admin)), &listed); err != nil {
		t.Fatal(err)
	}
	if len(listed.SSHKeys) != 2 || listed.SSHKeys[0].Name != "alice" || listed.SSHKeys[0].Line != 2 || listed.SSHKeys[1].Role != "viewer" || listed.SSHKeys[1].File != keys {
		t.Fatalf("ssh_keys: %+v", listed.SSHKeys)
	}
	if err := os.WriteFile(keys, []byte("role=viewer "+carol+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustGpuctl(t, "user", "list", "--config", admin); strings.Contains(out, "alice") || !strings.Contains(out, "carol") {
		t.Fatalf("after alice's line was deleted:\n%s", out)
	}
	if err := os.WriteFile(keys, []byte("role=chief "+carol+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := mustGpuctl(t, "user", "list", "--config", admin); !strings.Contains(out, "the file cannot be used, so no key logs in") || !strings.Contains(out, keys+":1") {
		t.Fatalf("with a broken file:\n%s", out)
	}
}
