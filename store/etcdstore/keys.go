package etcdstore

import "fmt"

// keys is the layout under the prefix. Records sit under one folder per
// kind, so a kind is one ranged read in key order (the order bbolt's
// buckets give: nodes by name, jobs by id).
//
//	nodes/<name>            api.NodeStatus
//	jobs/<id>               api.Job
//	events/<t><fence><n>    api.Event; 48 hex digits, see eventKey
//	eventseq/<node>         8-byte big-endian highest persisted seq
//	identities/<serial>     api.Identity
//	revoked/<serial>        api.Revocation
//	tokens/<id>             api.JoinToken
//	secrets/<name>          raw bytes (the cluster CA)
//	meta/…
type keys struct{ p string }

func (k keys) nodes() string               { return k.p + "nodes/" }
func (k keys) node(name string) string     { return k.nodes() + name }
func (k keys) jobs() string                { return k.p + "jobs/" }
func (k keys) job(id string) string        { return k.jobs() + id }
func (k keys) events() string              { return k.p + "events/" }
func (k keys) eventSeq(node string) string { return k.p + "eventseq/" + node }
func (k keys) identities() string          { return k.p + "identities/" }
func (k keys) identity(serial string) string {
	return k.identities() + serial
}
func (k keys) revoked(serial string) string { return k.p + "revoked/" + serial }
func (k keys) tokens() string               { return k.p + "tokens/" }
func (k keys) token(id string) string       { return k.tokens() + id }
func (k keys) secret(name string) string    { return k.p + "secrets/" + name }
func (k keys) meta(name string) string      { return k.p + "meta/" + name }

// eventKey orders the log by the event's time (negative as 0), then by the
// creation revision of the leadership it was written under (a later leader
// sorts after an earlier one), then by the order this leader wrote it.
// Fixed-width hex keeps byte order equal to numeric order, so Events'
// newest-N is one descending ranged read and SinceUnixNano its start key.
func (k keys) event(unixNano, fenceRev int64, n uint64) string {
	return k.events() + fmt.Sprintf("%016x%016x%016x", uint64(max(unixNano, 0)), uint64(max(fenceRev, 0)), n)
}

// eventsSince is the first key of events at or after unixNano.
func (k keys) eventsSince(unixNano int64) string {
	return k.events() + fmt.Sprintf("%016x", uint64(max(unixNano, 0)))
}
