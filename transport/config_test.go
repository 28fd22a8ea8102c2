package transport

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestClientConfigRoundTrip(t *testing.T) {
	ctx := testCtx(t)
	a := newAuthority(t, AuthorityOptions{})
	l := startListener(t, a, ListenConfig{})
	admin, err := a.IssueClient("admin", RoleAdmin)
	if err != nil {
		t.Fatal(err)
	}
	// The server writes admin.yaml into its own data dir, next to ca.crt.
	path := filepath.Join(a.Dir(), "admin.yaml")
	if err := WriteClientConfig(path, l.Addr().String(), admin); err != nil {
		t.Fatalf("WriteClientConfig: %v", err)
	}
	if err := WriteClientConfig(path, l.Addr().String(), admin); err == nil {
		t.Fatalf("WriteClientConfig overwrote an existing config")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"server: " + l.Addr().String(), "ca: ca.crt", "cert: admin.crt", "key: admin.key"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("admin.yaml lacks %q:\n%s", want, data)
		}
	}
	// Relative paths resolve against the file, wherever the process runs.
	moved := filepath.Join(t.TempDir(), "copy")
	if err := os.CopyFS(moved, os.DirFS(a.Dir())); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Join(moved, "admin.key"), 0o600)
	cfg, id, err := LoadClientConfig(filepath.Join(moved, "admin.yaml"))
	if err != nil {
		t.Fatalf("LoadClientConfig: %v", err)
	}
	if cfg.Key != filepath.Join(moved, "admin.key") || id.Role != RoleAdmin || id.Name != "admin" {
		t.Fatalf("loaded %+v as %s %q", cfg, id.Role, id.Name)
	}
	c, err := DialClient(ctx, cfg.Server, id)
	if err != nil {
		t.Fatalf("DialClient: %v", err)
	}
	defer c.Close()
	sc := acceptOne(t, ctx, l)
	if sc.Role() != RoleAdmin {
		t.Fatalf("server sees role %s", sc.Role())
	}

	// A second config in the same dir shares ca.crt; one for another
	// cluster's CA is refused rather than replacing it.
	viewer, _ := a.IssueClient("bob", RoleViewer)
	if err := WriteClientConfig(filepath.Join(a.Dir(), "bob.yaml"), "127.0.0.1:7443", viewer); err != nil {
		t.Fatalf("second config: %v", err)
	}
	foreign, _ := newAuthority(t, AuthorityOptions{}).IssueClient("eve", RoleViewer)
	err = WriteClientConfig(filepath.Join(a.Dir(), "eve.yaml"), "127.0.0.1:7443", foreign)
	wantErrContains(t, err, "holds another CA")
}

func TestParseClientConfig(t *testing.T) {
	tests := []struct {
		name, yaml string
		wantErr    string
		servers    []string // default 10.0.0.1:7443
	}{
		{"good", "server: 10.0.0.1:7443\nca: ca.crt\ncert: /etc/gpuctl/me.crt\nkey: me.key\n", "", nil},
		{"unknown key", "server: h:1\nca: a\ncert: b\nkey: c\nport: 7443\n", "field port not found", nil},
		{"no port", "server: 10.0.0.1\nca: a\ncert: b\nkey: c\n", "want host:port", nil},
		{"bad port", "server: h:http\nca: a\ncert: b\nkey: c\n", "port \"http\"", nil},
		{"missing key", "server: h:1\nca: a\ncert: b\n", "key: missing", nil},
		{"not yaml", "server: [\n", "parse YAML", nil},
		{"empty", "", "parse YAML", nil},
		{"path and data", "server: h:1\nca: a\ncert: b\nkey: c\nkey_data: x\n", "key and key_data both given", nil},
		{"server list", "server: a:1, b:2,a:1\nca: ca.crt\ncert: /etc/gpuctl/me.crt\nkey: me.key\n", "", []string{"a:1", "b:2"}},
		{"servers YAML list", "servers:\n  - a:1\n  - b:2\nca: ca.crt\ncert: /etc/gpuctl/me.crt\nkey: me.key\n", "", []string{"a:1", "b:2"}},
		{"server and servers", "server: a:1\nservers: [b:2]\nca: a\ncert: b\nkey: c\n", "server and servers both given", nil},
		{"no server", "ca: a\ncert: b\nkey: c\n", "server: no server address", nil},
		{"bad entry in the list", "servers: [a:1, b]\nca: a\ncert: b\nkey: c\n", `server address "b"`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseClientConfig([]byte(tc.yaml), "/base")
			if tc.wantErr != "" {
				wantErrContains(t, err, tc.wantErr)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.CA != "/base/ca.crt" || cfg.Cert != "/etc/gpuctl/me.crt" || cfg.Key != "/base/me.key" {
				t.Fatalf("paths resolved to %+v", cfg)
			}
			want := tc.servers
			if want == nil {
				want = []string{"10.0.0.1:7443"}
			}
			if !slices.Equal(cfg.Servers, want) || cfg.Server != strings.Join(want, ",") {
				t.Fatalf("servers %q (server %q), want %q", cfg.Servers, cfg.Server, want)
			}
		})
	}
}

func FuzzParseClientConfig(f *testing.F) {
	f.Add("server: 10.0.0.1:7443\nca: ca.crt\ncert: a.crt\nkey: a.key\n")
	f.Add("server: '[::1]:7443'\nca: /x\ncert: /y\nkey: /z\n")
	f.Add("{}")
	f.Add("server: &a h:1\nca: *a\n")
	f.Add("server: h:1\nca_data: x\ncert_data: y\nkey_data: z\n")
	f.Add("server: h:1\nca: a\nca_data: x\ncert: b\nkey_data: z\n")
	f.Add("servers: [a:1, 'b:2,c:3']\nca: a\ncert: b\nkey: c\n")
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := parseClientConfig([]byte(s), "/base")
		if err != nil {
			return
		}
		for _, f := range []struct{ path, data string }{{cfg.CA, cfg.CAData}, {cfg.Cert, cfg.CertData}, {cfg.Key, cfg.KeyData}} {
			if (f.path == "") == (f.data == "") {
				t.Fatalf("want exactly one of a path and inline data, got %q and %q", f.path, f.data)
			}
			if f.path != "" && !filepath.IsAbs(f.path) {
				t.Fatalf("path %q left relative", f.path)
			}
		}
		if len(cfg.Servers) == 0 || cfg.Server != strings.Join(cfg.Servers, ",") {
			t.Fatalf("accepted servers %q as server %q", cfg.Servers, cfg.Server)
		}
		for _, a := range cfg.Servers {
			if _, _, err := splitServer(a); err != nil {
				t.Fatalf("accepted server %q: %v", a, err)
			}
		}
	})
}
