package views

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

func sampleIdentities() []*api.Identity {
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	return []*api.Identity{
		{Kind: api.IdentityKind_IDENTITY_KIND_USER, Name: "admin", Role: "admin", Serial: "4f1c2a9be0d3117a8c", KeySha256: "9a0b1c2d3e4f5a6b7c8d",
			NotBeforeUnixNano: at(-49 * time.Hour), NotAfterUnixNano: at(364 * 24 * time.Hour), IssuedUnixNano: at(-48 * time.Hour), IssuedBy: "gpuctl serve (first start)"},
		{Kind: api.IdentityKind_IDENTITY_KIND_USER, Name: "bob", Role: "viewer", Serial: "77aa", KeySha256: "0011",
			NotAfterUnixNano: at(300 * 24 * time.Hour), IssuedUnixNano: at(-2 * time.Hour), IssuedBy: "admin",
			RevokedUnixNano: at(-10 * time.Minute), RevokedBy: "admin", RevokeReason: "left the team"},
		{Kind: api.IdentityKind_IDENTITY_KIND_NODE, Name: "node-01", Role: "node", Serial: "ab12", NotAfterUnixNano: at(-time.Hour),
			IssuedUnixNano: at(-400 * 24 * time.Hour), IssuedBy: "join token 0123456789abcdef"},
	}
}

func sampleTokens() []*api.JoinToken {
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	return []*api.JoinToken{
		{Id: "0123456789abcdef", CreatedUnixNano: at(-time.Hour), ExpiresUnixNano: at(23 * time.Hour), Uses: 3, CreatedBy: "admin", Description: "rack r12",
			Used: []*api.JoinTokenUse{{Node: "r12-a", TimeUnixNano: at(-50 * time.Minute)}}},
		{Id: "fedcba9876543210", CreatedUnixNano: at(-2 * time.Hour), ExpiresUnixNano: at(22 * time.Hour), Uses: 1, CreatedBy: "admin",
			Used: []*api.JoinTokenUse{{Node: "gpu-07", TimeUnixNano: at(-100 * time.Minute)}}},
		{Id: "00000000000000aa", CreatedUnixNano: at(-30 * time.Hour), ExpiresUnixNano: at(-6 * time.Hour), Uses: 1, CreatedBy: "ops"},
		{Id: "00000000000000bb", CreatedUnixNano: at(-time.Hour), ExpiresUnixNano: at(time.Hour), CreatedBy: "admin", RevokedUnixNano: at(-time.Minute), RevokedBy: "alice"},
	}
}

func TestIdentitiesFormats(t *testing.T) {
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Identities(&b, Options{Format: f, Width: 160, Now: now}, sampleIdentities()); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
}

func TestTokensFormats(t *testing.T) {
	for _, f := range []Format{Table, Wide, JSON} {
		t.Run(string(f), func(t *testing.T) {
			var b bytes.Buffer
			if err := Tokens(&b, Options{Format: f, Width: 160, Now: now}, sampleTokens()); err != nil {
				t.Fatal(err)
			}
			golden(t, b.Bytes())
		})
	}
	var b bytes.Buffer
	Tokens(&b, Options{Format: JSON, Now: now}, sampleTokens())
	var doc struct {
		Tokens []struct {
			ID, State string
			Uses      int
			Used      []struct{ Node string }
		}
	}
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	states := ""
	for _, tk := range doc.Tokens {
		states += tk.State + " "
	}
	if states != "valid used expired revoked " {
		t.Fatalf("token states %q", states)
	}
}
