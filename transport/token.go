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
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// Errors VerifyToken wraps, so callers can tell the cases apart.
var (
	ErrTokenMalformed    = errors.New("malformed join token")
	ErrTokenExpired      = errors.New("join token expired")
	ErrTokenBadSignature = errors.New("join token signature does not verify")
	ErrTokenWrongCluster = errors.New("join token belongs to another cluster")
	ErrTokenUnknown      = errors.New("join token unknown")
	ErrTokenRevoked      = errors.New("join token revoked")
	ErrTokenSpent        = errors.New("join token already used")
)

const (
	tokenVersion = "gpj1"
	tokenIDLen   = 16 // hex digits
	maxTokenTTL  = 365 * 24 * time.Hour
)

var tokenMACEncoding = base64.RawURLEncoding

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
	if t.mac, err = api.DecodeBase64URL(parts[3]); err != nil || len(t.mac) != sha256.Size {
		return Token{}, fmt.Errorf("%w: signature must be %d bytes of unpadded base64url (A-Z a-z 0-9 - _): copy the token as one line", ErrTokenMalformed, sha256.Size)
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

// TokenOptions says how a new join token may be used.
type TokenOptions struct {
	// TTL is how long the token is valid: more than 0, at most a year.
	TTL time.Duration
	// Uses is how many nodes may join with it; 0 means 1.
	Uses int
	// CreatedBy and Description are kept with the token's record.
	CreatedBy   string
	Description string
}

// maxTokenUses bounds --uses: a token for a whole rack, not an open door.
const maxTokenUses = 10_000

// TokenLedger keeps what the server knows of each join token (its limits
// and the joins made with it), so that a token is good for as many joins as
// it was made for and can be revoked. The control plane keeps it in the
// store; an Authority without one keeps it in memory.
type TokenLedger interface {
	// PutToken records a new token.
	PutToken(t *api.JoinToken) error
	// UpdateToken loads the record of id (nil when there is none), lets
	// update change it or refuse with an error, and stores the change, all
	// in one step, so two joins never both take a token's last use.
	UpdateToken(id string, update func(t *api.JoinToken) error) (*api.JoinToken, error)
}

// memLedger is the in-memory TokenLedger of an Authority that was given none.
type memLedger struct {
	mu     sync.Mutex
	tokens map[string]*api.JoinToken
}

func (m *memLedger) PutToken(t *api.JoinToken) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tokens == nil {
		m.tokens = map[string]*api.JoinToken{}
	}
	m.tokens[t.GetId()] = proto.Clone(t).(*api.JoinToken)
	return nil
}

func (m *memLedger) UpdateToken(id string, update func(*api.JoinToken) error) (*api.JoinToken, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var t *api.JoinToken
	if old := m.tokens[id]; old != nil {
		t = proto.Clone(old).(*api.JoinToken)
	}
	if err := update(t); err != nil {
		return t, err
	}
	if t != nil {
		m.tokens[id] = t
	}
	return t, nil
}

// SetTokenLedger makes l the keeper of join token records; tokens created
// before are forgotten.
func (a *Authority) SetTokenLedger(l TokenLedger) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ledger = l
}

func (a *Authority) tokenLedger() TokenLedger {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.ledger
}

// CreateToken returns a single-use join token valid for ttl (at most a
// year) and the moment it expires.
func (a *Authority) CreateToken(ttl time.Duration) (string, time.Time, error) {
	tok, rec, err := a.IssueToken(TokenOptions{TTL: ttl})
	if err != nil {
		return "", time.Time{}, err
	}
	return tok, time.Unix(0, rec.GetExpiresUnixNano()), nil
}

// IssueToken signs a join token under opts, records it in the ledger and
// returns it with its record.
func (a *Authority) IssueToken(opts TokenOptions) (string, *api.JoinToken, error) {
	switch {
	case opts.TTL <= 0:
		return "", nil, fmt.Errorf("create join token: lifetime %s is not positive: give how long the token may be used, e.g. --ttl 1h", opts.TTL)
	case opts.TTL < time.Second || opts.TTL > maxTokenTTL:
		return "", nil, fmt.Errorf("create join token: lifetime %s must be between 1s and %s", opts.TTL, maxTokenTTL)
	case opts.Uses < 0 || opts.Uses > maxTokenUses:
		return "", nil, fmt.Errorf("create join token: %d uses: give 1 to %d nodes that may join with it", opts.Uses, maxTokenUses)
	}
	uses := max(opts.Uses, 1)
	var id [tokenIDLen / 2]byte
	if _, err := rand.Read(id[:]); err != nil {
		return "", nil, fmt.Errorf("create join token: %w", err)
	}
	now := a.now()
	t := Token{
		ID:     hex.EncodeToString(id[:]),
		Expiry: now.Add(opts.TTL).Truncate(time.Second),
		CAHash: a.caHash,
	}
	a.mu.RLock()
	t.mac = tokenMAC(a.secret, t)
	a.mu.RUnlock()
	rec := &api.JoinToken{
		Id: t.ID, CreatedUnixNano: now.UnixNano(), ExpiresUnixNano: t.Expiry.UnixNano(), Uses: uint32(uses),
		CreatedBy: opts.CreatedBy, Description: opts.Description,
	}
	if err := a.tokenLedger().PutToken(rec); err != nil {
		return "", nil, fmt.Errorf("create join token: record it: %w", err)
	}
	return t.String(), rec, nil
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

// errTokenUsable ends a look at a token's record that changes nothing.
var errTokenUsable = errors.New("join token usable")

// CheckToken verifies s (VerifyToken) and that its record allows another
// join, without taking one. The error wraps ErrTokenUnknown,
// ErrTokenRevoked or ErrTokenSpent besides VerifyToken's errors.
func (a *Authority) CheckToken(s string) error {
	if err := a.VerifyToken(s); err != nil {
		return err
	}
	t, _ := ParseToken(s)
	_, err := a.tokenLedger().UpdateToken(t.ID, func(rec *api.JoinToken) error {
		if err := tokenUsable(t.ID, rec); err != nil {
			return err
		}
		return errTokenUsable
	})
	if errors.Is(err, errTokenUsable) {
		return nil
	}
	return err
}

// UseToken verifies s and takes one of its joins for node, in one step
// with the check, so a single-use token admits exactly one node.
func (a *Authority) UseToken(s, node string) error {
	if err := a.VerifyToken(s); err != nil {
		return err
	}
	t, _ := ParseToken(s)
	now := a.now()
	_, err := a.tokenLedger().UpdateToken(t.ID, func(rec *api.JoinToken) error {
		if err := tokenUsable(t.ID, rec); err != nil {
			return err
		}
		rec.Used = append(rec.Used, &api.JoinTokenUse{Node: node, TimeUnixNano: now.UnixNano()})
		return nil
	})
	return err
}

// tokenUsable says why the token's record allows no more joins, or nil.
func tokenUsable(id string, rec *api.JoinToken) error {
	const fix = "create a new one with `gpuctl token create`"
	switch {
	case rec == nil:
		return fmt.Errorf("%w: this server has no record of token %s (it was made by another server, or before the server's state was restored from a backup): %s", ErrTokenUnknown, id, fix)
	case rec.GetRevokedUnixNano() != 0:
		return fmt.Errorf("%w: token %s was revoked at %s by %s: %s", ErrTokenRevoked, id,
			time.Unix(0, rec.GetRevokedUnixNano()).UTC().Format(time.RFC3339), orUnknown(rec.GetRevokedBy()), fix)
	case len(rec.GetUsed()) >= int(max(rec.GetUses(), 1)):
		var by []string
		for _, u := range rec.GetUsed() {
			by = append(by, fmt.Sprintf("%s at %s", u.GetNode(), time.Unix(0, u.GetTimeUnixNano()).UTC().Format(time.RFC3339)))
		}
		return fmt.Errorf("%w: token %s allowed %d join(s) and was used by %s: %s (--uses N makes a token several nodes may share)",
			ErrTokenSpent, id, max(rec.GetUses(), 1), strings.Join(by, ", "), fix)
	}
	return nil
}

func orUnknown(s string) string {
	if s == "" {
		return "an unknown admin"
	}
	return s
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
