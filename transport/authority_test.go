package transport

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestAuthorityRestartReusesCA(t *testing.T) {
	dir := t.TempDir()
	a1, err := OpenAuthority(dir, AuthorityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := a1.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CAKeyFile, ServerKeyFile, TokenSecretFile} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s has mode %#o, want 0600", f, perm)
		}
	}
	a2, err := OpenAuthority(dir, AuthorityOptions{})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if a1.CAHash() != a2.CAHash() {
		t.Errorf("CA changed across restart: %s then %s", a1.CAHash(), a2.CAHash())
	}
	if !a1.ServerCertificate().Leaf.Equal(a2.ServerCertificate().Leaf) {
		t.Errorf("server certificate was reissued on a plain restart")
	}
	if err := a2.VerifyToken(tok); err != nil {
		t.Errorf("token from before the restart: %v", err)
	}
}

func TestAuthorityReissuesServerCertForNewNames(t *testing.T) {
	dir := t.TempDir()
	a1, err := OpenAuthority(dir, AuthorityOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := OpenAuthority(dir, AuthorityOptions{ServerNames: []string{"gpu-head.example", "10.1.2.3"}})
	if err != nil {
		t.Fatal(err)
	}
	leaf := a2.ServerCertificate().Leaf
	if !slices.Contains(leaf.DNSNames, "gpu-head.example") {
		t.Errorf("DNS names %v lack gpu-head.example", leaf.DNSNames)
	}
	if !slices.ContainsFunc(leaf.IPAddresses, net.ParseIP("10.1.2.3").Equal) {
		t.Errorf("IP addresses %v lack 10.1.2.3", leaf.IPAddresses)
	}
	for _, want := range []string{"localhost"} {
		if !slices.Contains(leaf.DNSNames, want) {
			t.Errorf("DNS names %v lack %s", leaf.DNSNames, want)
		}
	}
	if !publicKeysEqual(a1.ServerCertificate().Leaf.PublicKey, leaf.PublicKey) {
		t.Errorf("server key changed when the certificate was reissued")
	}
	if a1.CAHash() != a2.CAHash() {
		t.Errorf("CA changed")
	}
	if _, err := OpenAuthority(dir, AuthorityOptions{ServerNames: []string{"host:7443"}}); err == nil {
		t.Errorf("a server name with a port was accepted")
	}
}

func TestAuthorityRefusesBadFiles(t *testing.T) {
	other := t.TempDir()
	if _, err := OpenAuthority(other, AuthorityOptions{}); err != nil {
		t.Fatal(err)
	}
	copyFile := func(t *testing.T, from, to string) {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		damage func(t *testing.T, dir string)
		want   []string
	}{
		{"corrupt ca.crt", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, CACertFile), []byte("not a cert\n"), 0o644)
		}, []string{CACertFile, "corrupt", "backup"}},
		{"missing ca.key", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, CAKeyFile))
		}, []string{CAKeyFile, "missing", "restore"}},
		{"missing ca.crt", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, CACertFile))
		}, []string{CACertFile, "missing"}},
		{"ca.key of another cluster", func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(other, CAKeyFile), filepath.Join(dir, CAKeyFile))
		}, []string{CAKeyFile, "does not match", CACertFile}},
		{"ca.key readable by others", func(t *testing.T, dir string) {
			os.Chmod(filepath.Join(dir, CAKeyFile), 0o644)
		}, []string{CAKeyFile, "chmod 600"}},
		{"corrupt ca.key", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600)
		}, []string{CAKeyFile, "parse private key"}},
		{"short join.secret", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, TokenSecretFile), []byte("short"), 0o600)
		}, []string{TokenSecretFile, "corrupt"}},
		{"server.crt without server.key", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ServerKeyFile))
		}, []string{ServerKeyFile, "missing"}},
		{"server.crt of another cluster", func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(other, ServerCertFile), filepath.Join(dir, ServerCertFile))
			copyFile(t, filepath.Join(other, ServerKeyFile), filepath.Join(dir, ServerKeyFile))
		}, []string{ServerCertFile, "not signed by", "move"}},
		{"server.key not matching server.crt", func(t *testing.T, dir string) {
			copyFile(t, filepath.Join(other, ServerKeyFile), filepath.Join(dir, ServerKeyFile))
		}, []string{ServerCertFile, "does not match"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if _, err := OpenAuthority(dir, AuthorityOptions{}); err != nil {
				t.Fatal(err)
			}
			before := snapshotDir(t, dir)
			tc.damage(t, dir)
			damaged := snapshotDir(t, dir)
			_, err := OpenAuthority(dir, AuthorityOptions{})
			for _, w := range tc.want {
				wantErrContains(t, err, w)
			}
			if after := snapshotDir(t, dir); !mapsEqual(after, damaged) {
				t.Errorf("refused open changed the data dir (before damage %d files, after %d)", len(before), len(after))
			}
		})
	}
}

func snapshotDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = string(data)
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestIssueNodeAndClient(t *testing.T) {
	a := newAuthority(t, AuthorityOptions{})
	ec, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	rsaKey, _ := rsa.GenerateKey(rand.Reader, 2048)
	tests := []struct {
		name    string
		pub     any
		node    string
		wantErr string
	}{
		{"ecdsa p256", ec.Public(), "gpu-01", ""},
		{"ed25519", edPub, "gpu-02", ""},
		{"p224 refused", p224.Public(), "gpu-03", "P-256"},
		{"rsa refused", rsaKey.Public(), "gpu-04", "ECDSA P-256 or Ed25519"},
		{"bad name", ec.Public(), "-gpu", "must start with a letter or digit"},
		{"name with slash", ec.Public(), "gpu/1", "has '/'"},
		{"empty name", ec.Public(), "", "1 to 64"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cert, err := a.IssueNode(tc.pub, tc.node)
			if tc.wantErr != "" {
				wantErrContains(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			role, name, err := a.VerifyPeer([]*x509.Certificate{cert})
			if err != nil || role != RoleNode || name != tc.node {
				t.Fatalf("VerifyPeer = %s, %q, %v; want node %q", role, name, err, tc.node)
			}
		})
	}
	for _, role := range []Role{RoleViewer, RoleOperator, RoleAdmin} {
		id, err := a.IssueClient("alice", role)
		if err != nil {
			t.Fatal(err)
		}
		got, name, err := a.VerifyPeer([]*x509.Certificate{id.Certificate.Leaf})
		if err != nil || got != role || name != "alice" || id.Role != role {
			t.Errorf("client %s: VerifyPeer = %s, %q, %v", role, got, name, err)
		}
	}
	if _, err := a.IssueClient("alice", RoleNode); err == nil {
		t.Errorf("IssueClient accepted the node role")
	}
}

func TestVerifyPeerRefusesExpiredAndForeign(t *testing.T) {
	dir := t.TempDir()
	a := newAuthorityIn(t, dir, AuthorityOptions{})
	past := newAuthorityIn(t, dir, AuthorityOptions{Now: func() time.Time { return time.Now().Add(-72 * time.Hour) }, ClientCertTTL: 24 * time.Hour})
	expired, err := past.IssueClient("old", RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = a.VerifyPeer([]*x509.Certificate{expired.Certificate.Leaf})
	wantErrContains(t, err, "expired")

	other := newAuthority(t, AuthorityOptions{})
	foreign, err := other.IssueClient("mallory", RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = a.VerifyPeer([]*x509.Certificate{foreign.Certificate.Leaf})
	wantErrContains(t, err, "not issued by this cluster's CA")

	// The server certificate is for server authentication only.
	_, _, err = a.VerifyPeer([]*x509.Certificate{a.ServerCertificate().Leaf})
	wantErrContains(t, err, "usage")
}

func newAuthorityIn(t *testing.T, dir string, opts AuthorityOptions) *Authority {
	t.Helper()
	a, err := OpenAuthority(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestRoleOf(t *testing.T) {
	tests := []struct {
		name     string
		subject  pkix.Name
		wantRole Role
		wantErr  string
	}{
		{"node", pkix.Name{CommonName: "gpu-01", OrganizationalUnit: []string{"node"}}, RoleNode, ""},
		{"admin", pkix.Name{CommonName: "root@ops", OrganizationalUnit: []string{"admin"}}, RoleAdmin, ""},
		{"server", pkix.Name{CommonName: "gpuctl server", OrganizationalUnit: []string{"server"}}, RoleServer, ""},
		{"no role", pkix.Name{CommonName: "x"}, "", "carries no gpuctl role"},
		{"two roles", pkix.Name{CommonName: "x", OrganizationalUnit: []string{"admin", "node"}}, "", "carries no gpuctl role"},
		{"unknown role", pkix.Name{CommonName: "x", OrganizationalUnit: []string{"root"}}, "", "carries no gpuctl role"},
		{"bad name", pkix.Name{CommonName: "a b", OrganizationalUnit: []string{"viewer"}}, "", "common name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			role, name, err := RoleOf(&x509.Certificate{Subject: tc.subject})
			if tc.wantErr != "" {
				wantErrContains(t, err, tc.wantErr)
				return
			}
			if err != nil || role != tc.wantRole || name != tc.subject.CommonName {
				t.Fatalf("RoleOf = %s, %q, %v", role, name, err)
			}
		})
	}
}

func TestRoleAtLeast(t *testing.T) {
	tests := []struct {
		r, min Role
		want   bool
	}{
		{RoleAdmin, RoleViewer, true},
		{RoleOperator, RoleOperator, true},
		{RoleViewer, RoleOperator, false},
		{RoleNode, RoleViewer, false},
		{RoleAdmin, RoleNode, false},
	}
	for _, tc := range tests {
		if got := tc.r.AtLeast(tc.min); got != tc.want {
			t.Errorf("%s.AtLeast(%s) = %v, want %v", tc.r, tc.min, got, tc.want)
		}
	}
	if _, err := ParseRole("Operator "); err != nil {
		t.Errorf("ParseRole: %v", err)
	}
	if _, err := ParseRole("node"); err == nil {
		t.Errorf("ParseRole accepted node")
	}
}
