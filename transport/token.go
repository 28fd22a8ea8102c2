package transport

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Errors VerifyToken wraps, so callers can tell the cases apart.
var (
	ErrTokenMalformed    = errors.New("malformed join token")
	ErrTokenExpired      = errors.New("join token expired")
	ErrTokenBadSignature = errors.New("join token signature does not verify")
	ErrTokenWrongCluster = errors.New("join token belongs to another cluster")
)

const (
	tokenVersion = "gpj1"
	tokenIDLen   = 16 // hex digits
	maxTokenTTL  = 365 * 24 * time.Hour
)

var tokenMACEncoding = base64.RawURLEncoding.Strict()

// Token is a parsed join token. Parsing checks only its form; the server
// checks the signature and expiry with VerifyToken.
type Token struct {
	ID     string
	Expiry time.Time
	// CAHash is the SHA-256 of the cluster CA certificate's DER bytes.
	CAHash [sha256.Size]byte
	mac    []byte
}

// ParseToken parses the form of a join token (see the package doc). Leading
// and trailing white space, as left by a copy and paste, is ignored.
func ParseToken(s string) (Token, error) {
	s = strings.TrimSpace(s)
	parts := strings.Split(s, ".")
	if len(parts) != 5 {
		return Token{}, fmt.Errorf("%w: want 5 dot-separated fields gpj1.<id>.<expiry>.<mac>.<cahash>, got %d: copy the whole token", ErrTokenMalformed, len(parts))
	}
	if parts[0] != tokenVersion {
		return Token{}, fmt.Errorf("%w: starts with %.10q, want %q: this is not a gpuctl join token or comes from an incompatible release", ErrTokenMalformed, parts[0], tokenVersion)
	}
	var t Token
	if !isLowerHex(parts[1], tokenIDLen) {
		return Token{}, fmt.Errorf("%w: id must be %d lowercase hex digits", ErrTokenMalformed, tokenIDLen)
	}
	t.ID = parts[1]
	exp := parts[2]
	if exp == "" || len(exp) > 12 || strings.Trim(exp, "0123456789") != "" || (len(exp) > 1 && exp[0] == '0') {
		return Token{}, fmt.Errorf("%w: expiry must be a Unix time in seconds", ErrTokenMalformed)
	}
	sec, err := strconv.ParseInt(exp, 10, 64)
	if err != nil {
		return Token{}, fmt.Errorf("%w: expiry: %v", ErrTokenMalformed, err)
	}
	t.Expiry = time.Unix(sec, 0)
	if t.mac, err = tokenMACEncoding.DecodeString(parts[3]); err != nil || len(t.mac) != sha256.Size {
		return Token{}, fmt.Errorf("%w: signature must be %d bytes of unpadded base64url", ErrTokenMalformed, sha256.Size)
	}
	if !isLowerHex(parts[4], 2*sha256.Size) {
		return Token{}, fmt.Errorf("%w: CA hash must be %d lowercase hex digits", ErrTokenMalformed, 2*sha256.Size)
	}
	hex.Decode(t.CAHash[:], []byte(parts[4]))
	return t, nil
}

// String formats t back into its token text.
func (t Token) String() string {
	return fmt.Sprintf("%s.%s.%d.%s.%x", tokenVersion, t.ID, t.Expiry.Unix(), tokenMACEncoding.EncodeToString(t.mac), t.CAHash)
}

// signedPart is what the token's MAC covers: every field but the MAC.
func (t Token) signedPart() []byte {
	return fmt.Appendf(nil, "%s.%s.%d.%x", tokenVersion, t.ID, t.Expiry.Unix(), t.CAHash)
}

func tokenMAC(secret []byte, t Token) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(t.signedPart())
	return m.Sum(nil)
}

// CreateToken returns a join token valid for ttl (at most a year) and the
// moment it expires.
func (a *Authority) CreateToken(ttl time.Duration) (string, time.Time, error) {
	if ttl < time.Second || ttl > maxTokenTTL {
		return "", time.Time{}, fmt.Errorf("create join token: lifetime %s must be between 1s and %s", ttl, maxTokenTTL)
	}
	var id [tokenIDLen / 2]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", time.Time{}, fmt.Errorf("create join token: %w", err)
	}
	t := Token{
		ID:     hex.EncodeToString(id[:]),
		Expiry: a.now().Add(ttl).Truncate(time.Second),
		CAHash: a.caHash,
	}
	a.mu.RLock()
	t.mac = tokenMAC(a.secret, t)
	a.mu.RUnlock()
	return t.String(), t.Expiry, nil
}

// VerifyToken checks that s is a token this cluster signed and that it has
// not expired. The error wraps ErrTokenMalformed, ErrTokenWrongCluster,
// ErrTokenBadSignature or ErrTokenExpired.
func (a *Authority) VerifyToken(s string) error {
	t, err := ParseToken(s)
	if err != nil {
		return err
	}
	if !hmac.Equal(t.CAHash[:], a.caHash[:]) {
		return fmt.Errorf("%w: it pins CA %x but this server's CA is %x: create the token on the server you join", ErrTokenWrongCluster, t.CAHash[:6], a.caHash[:6])
	}
	a.mu.RLock()
	want := tokenMAC(a.secret, t)
	a.mu.RUnlock()
	if !hmac.Equal(t.mac, want) {
		return fmt.Errorf("%w: the token was altered or revoked: create a new one on the server", ErrTokenBadSignature)
	}
	if now := a.now(); !now.Before(t.Expiry) {
		return fmt.Errorf("%w at %s (%s ago): create a new one on the server", ErrTokenExpired, t.Expiry.UTC().Format(time.RFC3339), now.Sub(t.Expiry).Round(time.Second))
	}
	return nil
}

func isLowerHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
