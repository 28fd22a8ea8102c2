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
	NotBefore    *time.Time `json:"not_before_time"`
	NotAfter     *time.Time `json:"not_after_time"`
	Issued       *time.Time `json:"issued_time"`
	IssuedBy     *string    `json:"issued_by"`
	Revoked      *time.Time `json:"revoked_time"`
	RevokedBy    *string    `json:"revoked_by"`
	RevokeReason *string    `json:"revoke_reason"`
}

// IdentityFromAPI converts one identity record.
func IdentityFromAPI(id *api.Identity) IdentityJSON {
	kind := "user"
	if id.GetKind() == api.IdentityKind_IDENTITY_KIND_NODE {
		kind = "node"
	}
	return IdentityJSON{
		Kind: kind, Name: id.GetName(), Role: id.GetRole(), Serial: id.GetSerial(), KeySHA256: id.GetKeySha256(),
		NotBefore: optTime(id.GetNotBeforeUnixNano()), NotAfter: optTime(id.GetNotAfterUnixNano()),
		Issued: optTime(id.GetIssuedUnixNano()), IssuedBy: optString(id.GetIssuedBy()),
		Revoked: optTime(id.GetRevokedUnixNano()), RevokedBy: optString(id.GetRevokedBy()), RevokeReason: optString(id.GetRevokeReason()),
	}
}

// Identities renders certificate records: {"identities": [...]} as JSON.
func Identities(w io.Writer, o Options, ids []*api.Identity) error {
	now := o.now()
	out := make([]IdentityJSON, 0, len(ids))
	for _, id := range ids {
		out = append(out, IdentityFromAPI(id))
	}
	if o.Format == JSON {
		return writeJSON(w, struct {
			Identities []IdentityJSON `json:"identities"`
		}{out})
	}
	t := tableData{empty: "no identities"}
	t.cols = []column{{name: "NAME"}, {name: "ROLE"}, {name: "STATE"}, {name: "SERIAL"}, {name: "ISSUED"}, {name: "EXPIRES"}}
	if o.Format == Wide {
		t.cols = append(t.cols, column{name: "ISSUED BY"}, column{name: "KEY"}, column{name: "REVOKED BY"}, column{name: "REASON", flex: true})
	}
	for _, id := range out {
		state := "valid"
		switch {
		case id.Revoked != nil:
			state = "revoked " + age(now, *id.Revoked) + " ago"
		case id.NotAfter != nil && now.After(*id.NotAfter):
			state = "expired"
		}
		r := []cell{txt(id.Name), txt(id.Role), txt(state), txt(short(id.Serial, 12)), txt(ageOf(now, id.Issued) + " ago"), txt(until(now, id.NotAfter))}
		if o.Format == Wide {
			r = append(r, txt(dash(deref(id.IssuedBy))), txt(short(id.KeySHA256, 16)), txt(dash(deref(id.RevokedBy))), txt(dash(deref(id.RevokeReason))))
		}
		t.add(r...)
	}
	return o.writeTable(w, t)
}

// TokenJSON is one join token record in `gpuctl token list -o json`; the
// token itself is never kept, only its id.
type TokenJSON struct {
	ID          string         `json:"id"`
	State       string         `json:"state"`
	Created     *time.Time     `json:"created_time"`
	Expires     *time.Time     `json:"expires_time"`
	Uses        uint32         `json:"uses"`
	Used        []TokenUseJSON `json:"used"`
	CreatedBy   *string        `json:"created_by"`
	Description *string        `json:"description"`
	Revoked     *time.Time     `json:"revoked_time"`
	RevokedBy   *string        `json:"revoked_by"`
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
		ID: t.GetId(), State: TokenState(t, now), Created: optTime(t.GetCreatedUnixNano()), Expires: optTime(t.GetExpiresUnixNano()),
		Uses: max(t.GetUses(), 1), Used: []TokenUseJSON{}, CreatedBy: optString(t.GetCreatedBy()), Description: optString(t.GetDescription()),
		Revoked: optTime(t.GetRevokedUnixNano()), RevokedBy: optString(t.GetRevokedBy()),
	}
	for _, u := range t.GetUsed() {
		out.Used = append(out.Used, TokenUseJSON{Node: u.GetNode(), Time: timeOf(u.GetTimeUnixNano())})
	}
	return out
}

// Tokens renders join token records: {"tokens": [...]} as JSON.
func Tokens(w io.Writer, o Options, toks []*api.JoinToken) error {
	now := o.now()
	out := make([]TokenJSON, 0, len(toks))
	for _, t := range toks {
		out = append(out, TokenFromAPI(t, now))
	}
	if o.Format == JSON {
		return writeJSON(w, struct {
			Tokens []TokenJSON `json:"tokens"`
		}{out})
	}
	tb := tableData{empty: "no join tokens"}
	tb.cols = []column{{name: "ID"}, {name: "STATE"}, {name: "USES"}, {name: "EXPIRES"}, {name: "CREATED BY"}, {name: "DESCRIPTION", flex: true}}
	if o.Format == Wide {
		tb.cols = append(tb.cols, column{name: "CREATED"}, column{name: "NODES"})
	}
	for _, t := range out {
		r := []cell{txt(t.ID), txt(t.State), txt(fmt.Sprintf("%d/%d", len(t.Used), t.Uses)), txt(until(now, t.Expires)),
			txt(dash(deref(t.CreatedBy))), txt(dash(deref(t.Description)))}
		if o.Format == Wide {
			var nodes []string
			for _, u := range t.Used {
				nodes = append(nodes, u.Node)
			}
			r = append(r, txt(ageOf(now, t.Created)+" ago"), txt(dash(strings.Join(nodes, ","))))
		}
		tb.add(r...)
	}
	return o.writeTable(w, tb)
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

// SSHKeyJSON is one SSH console key in `gpuctl user list -o json`.
type SSHKeyJSON struct {
	Name        string `json:"name"`
	Role        string `json:"role"`
	Fingerprint string `json:"fingerprint"`
	File        string `json:"file"`
	Line        int32  `json:"line"`
}

// IdentityList renders certificate records and, when the SSH console
// runs, its keys: {"identities": [...], "ssh_keys": [...]} as JSON (with
// "ssh_keys_error" when the file cannot be read).
func IdentityList(w io.Writer, o Options, r *api.ListIdentitiesResponse) error {
	keys := make([]SSHKeyJSON, 0, len(r.GetSshKeys()))
	for _, k := range r.GetSshKeys() {
		keys = append(keys, SSHKeyJSON{Name: k.GetName(), Role: k.GetRole(), Fingerprint: k.GetFingerprint(), File: r.GetSshKeysFile(), Line: k.GetLine()})
	}
	if o.Format == JSON {
		out := make([]IdentityJSON, 0, len(r.GetIdentities()))
		for _, id := range r.GetIdentities() {
			out = append(out, IdentityFromAPI(id))
		}
		return writeJSON(w, struct {
			Identities  []IdentityJSON `json:"identities"`
			SSHKeys     []SSHKeyJSON   `json:"ssh_keys"`
			SSHKeyError *string        `json:"ssh_keys_error,omitempty"`
		}{out, keys, optString(r.GetSshKeysError())})
	}
	if err := Identities(w, o, r.GetIdentities()); err != nil {
		return err
	}
	if r.GetSshKeysFile() == "" {
		return nil
	}
	fmt.Fprintf(w, "\nSSH console keys, from %s (revoke one by deleting its line: its open sessions end within a second):\n", api.EscapeText(r.GetSshKeysFile()))
	if e := r.GetSshKeysError(); e != "" {
		fmt.Fprintf(w, "the file cannot be used, so no key logs in: %s\n", api.EscapeText(e))
	}
	t := tableData{empty: "no keys"}
	t.cols = []column{{name: "NAME"}, {name: "ROLE"}, {name: "LINE"}, {name: "FINGERPRINT", flex: true}}
	for _, k := range keys {
		t.add(txt(k.Name), txt(k.Role), txt(fmt.Sprint(k.Line)), txt(k.Fingerprint))
	}
	return o.writeTable(w, t)
}
