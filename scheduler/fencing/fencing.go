// Package fencing holds the rules that let a node's ranks outlive a
// silent control plane while a newer attempt of their job can never run
// beside them.
//
// A node renews its ranks' lease from the server or, when the server is
// silent, from a round of vouches: it asks each of its witnesses (other
// nodes, named at launch) and a round that Quorum of them answer yes
// extends the lease to the round's start plus the lease. A witness says no,
// for good, once the server has told it the attempt is superseded. Before
// the server starts a newer attempt over a lost node it has AcksToFence of
// the node's witnesses acknowledge that, so that no later round can reach a
// quorum, and waits out the lease from the last vouch any of them gave
// (Until). The rules are pure: no clock, no I/O.
package fencing

import (
	"slices"
	"time"
)

// MaxWitnesses bounds the witnesses of one node: each asks them all once
// a heartbeat, so the traffic of a round stays small on a large job.
const MaxWitnesses = 4

// Extra is how many nodes outside an attempt join its witness pool, so a
// one-node job has witnesses too and a job that lost every node can still
// be fenced by the others.
const Extra = 2

// Quorum is how many of n witnesses must vouch in one round: a strict
// majority, so any quorum meets any AcksToFence set.
func Quorum(n int) int { return n/2 + 1 }

// AcksToFence is how many of n witnesses must have acknowledged a
// superseded attempt before the yes-sayers left can no longer make a
// quorum.
func AcksToFence(n int) int { return n - Quorum(n) + 1 }

// Pool is an attempt's witness pool: its nodes in placement order, then up
// to Extra of others (by name), keeping only those that can be witnesses.
func Pool(attemptNodes, others []string, canWitness func(node string) bool) []string {
	var pool []string
	for _, n := range attemptNodes {
		if canWitness(n) && !slices.Contains(pool, n) {
			pool = append(pool, n)
		}
	}
	added := 0
	for _, n := range slices.Sorted(slices.Values(others)) {
		if added == Extra {
			break
		}
		if canWitness(n) && !slices.Contains(pool, n) && !slices.Contains(attemptNodes, n) {
			pool = append(pool, n)
			added++
		}
	}
	return pool
}

// Of returns node's witnesses in pool: the MaxWitnesses nodes after it,
// cyclically. A node outside the pool, or alone in it, has none: its ranks
// live on the server's lease alone.
func Of(pool []string, node string) []string {
	i := slices.Index(pool, node)
	if i < 0 {
		return nil
	}
	n := min(len(pool)-1, MaxWitnesses)
	out := make([]string, 0, n)
	for k := 1; k <= n; k++ {
		out = append(out, pool[(i+k)%len(pool)])
	}
	return out
}

// Ack is a witness's acknowledgement of a superseded attempt: when the
// server received it, and how long before sending it the witness last
// vouched for the job (or started).
type Ack struct {
	Witness    string
	Received   time.Time
	VouchedAgo time.Duration
}

// Until is when a lost node can no longer run an attempt it held, given
// its witnesses, the acknowledgements received, its last contact with the
// server and the lease; ok is false while too few witnesses acknowledged.
// The server's own renewals end by lastContact plus the lease; a round of
// vouches that reached a quorum included an acknowledging witness, which
// vouched no later than Received minus VouchedAgo (its clock's interval,
// measured back from a moment no earlier than its answer), so the round
// began no later and its lease ended by then plus the lease. margin covers
// the shims' kill time and clock rates.
func Until(witnesses []string, acks []Ack, lastContact time.Time, lease, margin time.Duration) (time.Time, bool) {
	until := lastContact
	seen := map[string]bool{}
	for _, a := range acks {
		if !slices.Contains(witnesses, a.Witness) || seen[a.Witness] {
			continue
		}
		seen[a.Witness] = true
		if v := a.Received.Add(-a.VouchedAgo); v.After(until) {
			until = v
		}
	}
	if len(witnesses) > 0 && len(seen) < AcksToFence(len(witnesses)) {
		return time.Time{}, false
	}
	return until.Add(lease + margin), true
}
