package transport

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSelectContext(t *testing.T) {
	two := "current_context: b\ncontexts:\n  - name: a\n    server: a:7443\n  - name: b\n    server: b:7443\n"
	for _, tc := range []struct {
		name, file, want, server, err string
	}{
		{"no contexts: the file", "server: x:7443\n", "", "x:7443", ""},
		{"no contexts, one named", "server: x:7443\n", "a", "", `has no contexts, so no context "a"`},
		{"the current one", two, "", "b:7443", ""},
		{"the one named", two, "a", "a:7443", ""},
		{"an unknown one", two, "c", "", `has no context "c": it has a, b`},
		{"the only one", "contexts:\n  - name: a\n    server: a:7443\n", "", "a:7443", ""},
		{"several, none current", "contexts:\n  - name: a\n    server: a:7443\n  - name: b\n    server: b:7443\n", "", "",
			"has contexts (a, b) but no current_context"},
		{"a context without a name", "contexts:\n  - server: a:7443\n", "", "", "context 1 has no name"},
		{"a name twice", "contexts:\n  - name: a\n    server: a:7443\n  - name: a\n    server: b:7443\n", "", "", `context "a" is listed twice`},
		{"a server beside contexts", "server: x:7443\ncontexts:\n  - name: a\n    server: a:7443\n", "", "", "both a top-level server and contexts"},
		{"an unknown key", "contexts:\n  - name: a\n    sever: a:7443\n", "", "", "field sever not found"},
	} {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := selectContext(path, []byte(tc.file), tc.want)
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case !strings.Contains(string(got), "server: "+tc.server):
			t.Errorf("%s: chose\n%s\nwant server %s", tc.name, got, tc.server)
		}
	}
}

// TestUseContextKeepsTheRest: switching rewrites current_context and
// nothing else the file says, comments included.
func TestUseContextKeepsTheRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "config.yaml")
	file := "# clusters of the lab\ncurrent_context: a\ncontexts:\n  - name: a # the old one\n    server: a:7443\n  - name: b\n    server: b:7443\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := UseContext(path, "b"); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	for _, want := range []string{"# clusters of the lab", "current_context: b", "# the old one", "server: b:7443"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("after use-context the file lacks %q:\n%s", want, got)
		}
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v after the edit, want 0600", fi.Mode().Perm())
	}
}

func FuzzSelectContext(f *testing.F) {
	f.Add([]byte("current_context: b\ncontexts:\n  - name: a\n    server: a:7443\n  - name: b\n    server: b:7443\n"), "a")
	f.Add([]byte("server: x:7443\n"), "")
	f.Fuzz(func(t *testing.T, data []byte, want string) {
		path := filepath.Join(t.TempDir(), "config.yaml")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := selectContext(path, data, want)
		if err != nil {
			return
		}
		// What is chosen is a client config of its own: no contexts in it.
		if _, err := readConfigFile(path); err != nil {
			t.Fatalf("chosen from a file that does not read: %v", err)
		}
		if strings.Contains(string(out), "contexts:") && want != "" {
			t.Fatalf("a chosen context holds contexts:\n%s", out)
		}
	})
}
