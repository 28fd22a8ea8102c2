package transport

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestVerifyToken(t *testing.T) {
	dir := t.TempDir()
	a := newAuthorityIn(t, dir, AuthorityOptions{})
	good, exp, err := a.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(exp); d < 59*time.Minute || d > time.Hour {
		t.Errorf("expiry %s is not an hour away", exp)
	}
	past := newAuthorityIn(t, dir, AuthorityOptions{Now: func() time.Time { return time.Now().Add(-2 * time.Hour) }})
	expired, _, err := past.CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	foreign, _, err := newAuthority(t, AuthorityOptions{}).CreateToken(time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tampered := func(tok string, field int, repl string) string {
		p := strings.Split(tok, ".")
		p[field] = repl
		return strings.Join(p, ".")
	}
	// A token whose expiry was pushed out no longer matches its MAC.
	extended := tampered(expired, 2, "9999999999")
	flipped := []byte(good)
	macStart := strings.LastIndex(good, ".") - 10
	if flipped[macStart] == 'A' {
		flipped[macStart] = 'B'
	} else {
		flipped[macStart] = 'A'
	}

	tests := []struct {
		name    string
		token   string
		wantErr error
		wantMsg string
	}{
		{"good", good, nil, ""},
		{"good with newline", " " + good + "\n", nil, ""},
		{"expired", expired, ErrTokenExpired, "create a new one"},
		{"extended expiry", extended, ErrTokenBadSignature, "altered or revoked"},
		{"flipped mac", string(flipped), ErrTokenBadSignature, "altered"},
		{"other cluster", foreign, ErrTokenWrongCluster, "another cluster"},
		{"empty", "", ErrTokenMalformed, "5 dot-separated fields"},
		{"truncated", good[:len(good)-5], ErrTokenMalformed, "CA hash"},
		{"other scheme", tampered(good, 0, "kube1"), ErrTokenMalformed, "not a gpuctl join token"},
		{"uppercase id", tampered(good, 1, strings.ToUpper(strings.Split(good, ".")[1])+"X"), ErrTokenMalformed, "id must be"},
		{"leading zero expiry", tampered(good, 2, "0"+strings.Split(good, ".")[2]), ErrTokenMalformed, "expiry"},
		{"signed expiry", tampered(good, 2, "+1"), ErrTokenMalformed, "expiry"},
		{"padded mac", tampered(good, 3, strings.Split(good, ".")[3]+"="), ErrTokenMalformed, "signature"},
		{"newline inside mac", tampered(good, 3, strings.Split(good, ".")[3][:10]+"\n"+strings.Split(good, ".")[3][10:]), ErrTokenMalformed, "as one line"},
		{"carriage return inside mac", tampered(good, 3, "\r"+strings.Split(good, ".")[3]), ErrTokenMalformed, "as one line"},
		{"space inside mac", tampered(good, 3, strings.Split(good, ".")[3][:5]+" "+strings.Split(good, ".")[3][5:]), ErrTokenMalformed, "signature"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := a.VerifyToken(tc.token)
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("VerifyToken: %v", err)
				}
				return
			}
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("VerifyToken = %v, want %v", err, tc.wantErr)
			}
			wantErrContains(t, err, tc.wantMsg)
		})
	}

	if err := a.RevokeTokens(); err != nil {
		t.Fatal(err)
	}
	if err := a.VerifyToken(good); !errors.Is(err, ErrTokenBadSignature) {
		t.Errorf("token after RevokeTokens: %v, want ErrTokenBadSignature", err)
	}
	reopened := newAuthorityIn(t, dir, AuthorityOptions{})
	if err := reopened.VerifyToken(good); !errors.Is(err, ErrTokenBadSignature) {
		t.Errorf("revocation did not survive a restart: %v", err)
	}
	for _, ttl := range []time.Duration{0, -time.Minute, 2 * maxTokenTTL} {
		if _, _, err := a.CreateToken(ttl); err == nil {
			t.Errorf("CreateToken(%s) accepted", ttl)
		}
	}
}

func TestParseTokenCarriesPin(t *testing.T) {
	a := newAuthority(t, AuthorityOptions{})
	tok, exp, err := a.CreateToken(10 * time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.String(); got != tok {
		t.Errorf("String() = %q, want %q", got, tok)
	}
	if !p.Expiry.Equal(exp) {
		t.Errorf("Expiry = %s, want %s", p.Expiry, exp)
	}
	if !strings.HasSuffix(tok, a.CAHash()) {
		t.Errorf("token %q does not end with the CA hash %s", tok, a.CAHash())
	}
}

func FuzzParseToken(f *testing.F) {
	f.Add("gpj1.0123456789abcdef.1767225600.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	f.Add("gpj1.0123456789abcdef.0.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n")
	f.Add("gpj1....")
	f.Add("gpj1.x.1.y.z")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrTokenMalformed) {
				t.Fatalf("ParseToken error %v does not wrap ErrTokenMalformed", err)
			}
			return
		}
		// A token that parses has exactly one spelling.
		if got, want := tok.String(), strings.TrimSpace(s); got != want {
			t.Fatalf("ParseToken(%q).String() = %q", want, got)
		}
	})
}
