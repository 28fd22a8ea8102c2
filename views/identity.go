package views

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// IdentityJSON is one certificate in `gpuctl user list -o json`.
type IdentityJSON struct {
	Kind         string     `json:"kind"`
	Name         string     `json:"name"`
	Role         string     `json:"role"`
	Serial       string     `json:"serial"`
	KeySHA256    string     `json:"key_sha256"`
	NotBefore    *time.Time `json:"not_before"`
	NotAfter     *time.Time `json:"not_after"`
	Issued       *time.Time `json:"issued"`
	IssuedBy     string     `json:"issued_by"`
	Revoked      *time.Time `json:"revoked"`
	RevokedBy    string     `json:"revoked_by,omitempty"`
	RevokeReason string     `json:"revoke_reason,omitempty"`
}

// IdentityFromAPI converts one identity record.
func IdentityFromAPI(id *api.Identity) IdentityJSON {
	kind := "user"
	if id.GetKind() == api.IdentityKind_IDENTITY_KIND_NODE {
		kind = "node"
	}
	return IdentityJSON{
		Kind: kind, Name: id.GetName(), Role: id.GetRole(), Serial: id.GetSerial(), KeySHA256: id.GetKeySha256(),
		NotBefore: timePtr(id.GetNotBeforeUnixNano()), NotAfter: timePtr(id.GetNotAfterUnixNano()),
		Issued: timePtr(id.GetIssuedUnixNano()), IssuedBy: id.GetIssuedBy(),
		Revoked: timePtr(id.GetRevokedUnixNano()), RevokedBy: id.GetRevokedBy(), RevokeReason: id.GetRevokeReason(),
	}
}

// Identities renders certificate records: {"identities": [...]} as JSON.
func Identities(w io.Writer, f Format, ids []*api.Identity, now time.Time) error {
	out := make([]IdentityJSON, 0, len(ids))
	for _, id := range ids {
		out = append(out, IdentityFromAPI(id))
	}
	if f == JSON {
		return writeJSON(w, struct {
			Identities []IdentityJSON `json:"identities"`
		}{out})
	}
	header := []string{"NAME", "ROLE", "STATE", "SERIAL", "ISSUED", "EXPIRES"}
	if f == Wide {
		header = append(header, "ISSUED BY", "KEY", "REVOKED BY", "REASON")
	}
	var rows [][]string
	for _, id := range out {
		state := "valid"
		switch {
		case id.Revoked != nil:
			state = "revoked " + age(now, *id.Revoked) + " ago"
		case id.NotAfter != nil && now.After(*id.NotAfter):
			state = "expired"
		}
		r := []string{id.Name, id.Role, state, short(id.Serial, 12), ageOf(now, id.Issued) + " ago", until(now, id.NotAfter)}
		if f == Wide {
			r = append(r, dash(id.IssuedBy), short(id.KeySHA256, 16), dash(id.RevokedBy), dash(id.RevokeReason))
		}
		rows = append(rows, r)
	}
	return table(w, header, rows)
}

// TokenJSON is one join token record in `gpuctl token list -o json`; the
// token itself is never kept, only its id.
type TokenJSON struct {
	ID          string         `json:"id"`
	State       string         `json:"state"`
	Created     *time.Time     `json:"created"`
	Expires     *time.Time     `json:"expires"`
	Uses        uint32         `json:"uses"`
	Used        []TokenUseJSON `json:"used"`
	CreatedBy   string         `json:"created_by"`
	Description string         `json:"description,omitempty"`
	Revoked     *time.Time     `json:"revoked"`
	RevokedBy   string         `json:"revoked_by,omitempty"`
}

// TokenUseJSON is one join made with a token.
type TokenUseJSON struct {
	Node string    `json:"node"`
	Time time.Time `json:"time"`
}

// TokenState is a token's state as of now: valid, used (every join
// taken), expired or revoked.
func TokenState(t *api.JoinToken, now time.Time) string {
	switch {
	case t.GetRevokedUnixNano() != 0:
		return "revoked"
	case len(t.GetUsed()) >= int(max(t.GetUses(), 1)):
		return "used"
	case !now.Before(time.Unix(0, t.GetExpiresUnixNano())):
		return "expired"
	}
	return "valid"
}

// TokenFromAPI converts one token record.
func TokenFromAPI(t *api.JoinToken, now time.Time) TokenJSON {
	out := TokenJSON{
		ID: t.GetId(), State: TokenState(t, now), Created: timePtr(t.GetCreatedUnixNano()), Expires: timePtr(t.GetExpiresUnixNano()),
		Uses: max(t.GetUses(), 1), Used: []TokenUseJSON{}, CreatedBy: t.GetCreatedBy(), Description: t.GetDescription(),
		Revoked: timePtr(t.GetRevokedUnixNano()), RevokedBy: t.GetRevokedBy(),
	}
	for _, u := range t.GetUsed() {
		out.Used = append(out.Used, TokenUseJSON{Node: u.GetNode(), Time: timeOf(u.GetTimeUnixNano())})
	}
	return out
}

// Tokens renders join token records: {"tokens": [...]} as JSON.
func Tokens(w io.Writer, f Format, toks []*api.JoinToken, now time.Time) error {
	out := make([]TokenJSON, 0, len(toks))
	for _, t := range toks {
		out = append(out, TokenFromAPI(t, now))
	}
	if f == JSON {
		return writeJSON(w, struct {
			Tokens []TokenJSON `json:"tokens"`
		}{out})
	}
	header := []string{"ID", "STATE", "USES", "EXPIRES", "CREATED BY", "DESCRIPTION"}
	if f == Wide {
		header = append(header, "CREATED", "NODES")
	}
	var rows [][]string
	for _, t := range out {
		r := []string{t.ID, t.State, fmt.Sprintf("%d/%d", len(t.Used), t.Uses), until(now, t.Expires), dash(t.CreatedBy), dash(t.Description)}
		if f == Wide {
			var nodes []string
			for _, u := range t.Used {
				nodes = append(nodes, u.Node)
			}
			r = append(r, ageOf(now, t.Created)+" ago", dash(strings.Join(nodes, ",")))
		}
		rows = append(rows, r)
	}
	return table(w, header, rows)
}

func ageOf(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	return age(now, *t)
}

// until renders how far ahead t is ("in 23h59m"), or "expired".
func until(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	if !now.Before(*t) {
		return "expired"
	}
	return "in " + age(*t, now) // age of now as seen from t: how long until t
}

func short(s string, n int) string {
	if len(s) <= n {
		return dash(s)
	}
	return s[:n] + "…"
}
