package sshserve

import (
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/gpuctl/gpuctl/transport"
)

func pubLine(t testing.TB) (string, gossh.Signer) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(gossh.MarshalAuthorizedKey(s.PublicKey()))), s
}

func TestParseAuthorizedKeys(t *testing.T) {
	k1, _ := pubLine(t)
	k2, _ := pubLine(t)
	cases := []struct {
		name    string
		file    string
		want    map[string]transport.Role // name → role
		wantErr string
	}{
		{"roles and names", "# console keys\nrole=operator " + k1 + " alice@laptop\n\nrole=viewer,name=oncall " + k2 + " whatever\n",
			map[string]transport.Role{"alice@laptop": transport.RoleOperator, "oncall": transport.RoleViewer}, ""},
		{"admin", "role=admin " + k1 + " root", map[string]transport.Role{"root": transport.RoleAdmin}, ""},
		{"no role", k1 + " alice", nil, "keys:1: no role"},
		{"unknown role", "role=god " + k1 + " alice", nil, `keys:1: unknown client role "god"`},
		{"unknown option", "role=viewer,no-pty " + k1 + " alice", nil, `keys:1: option "no-pty" is not understood`},
		{"no name", "role=viewer " + k1, nil, "keys:1: name \"\""},
		{"bad key", "role=viewer ssh-ed25519 AAAAnotbase64 alice", nil, "keys:1:"},
		{"duplicate", "role=viewer " + k1 + " a\nrole=admin " + k1 + " b", nil, "keys:2: key SHA256:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			keys, err := ParseAuthorizedKeys("keys", []byte(tc.file))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]transport.Role{}
			for _, k := range keys {
				got[k.Name] = k.Role
			}
			if len(got) != len(tc.want) {
				t.Fatalf("keys %v, want %v", got, tc.want)
			}
			for n, r := range tc.want {
				if got[n] != r {
					t.Errorf("%s has role %q, want %q", n, got[n], r)
				}
			}
		})
	}
}

func FuzzParseAuthorizedKeys(f *testing.F) {
	k, _ := pubLine(f)
	f.Add([]byte("role=operator " + k + " alice\n"))
	f.Add([]byte("# comment\n\nrole=viewer,name=x " + k + "\n"))
	f.Add([]byte("role= " + k))
	f.Fuzz(func(t *testing.T, data []byte) {
		keys, err := ParseAuthorizedKeys("f", data)
		if err != nil {
			return
		}
		for fp, k := range keys {
			if !k.Role.IsClient() || transport.ValidateName(k.Name) != nil || fp != k.Fingerprint {
				t.Fatalf("accepted a bad entry %+v", k)
			}
		}
	})
}
