package agent

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// leaseState is what the executor knows of the server's lease.
type leaseState struct {
	// dur is the lease the server grants; 0: none, ranks run unfenced.
	dur time.Duration
	// deadline is the latest end of lease the server confirmed; floor the
	// one a rank launched in this session starts with (the session's start
	// plus the lease: the server heard the node then).
	deadline, floor time.Time
	// peer is, per attempt, the latest end of lease a quorum of its
	// witnesses confirmed (peer lease: the ranks outlive a silent server).
	peer map[attemptKey]time.Time
}

// attemptKey names one attempt of a job.
type attemptKey struct {
	job     string
	attempt uint32
}

// of is the deadline of an attempt's lease file: the later of the
// server's and its witnesses'.
func (l leaseState) of(k attemptKey) time.Time {
	if p := l.peer[k]; p.After(l.deadline) {
		return p
	}
	return l.deadline
}

// start returns the deadline a rank launched now starts with.
func (l leaseState) start() time.Time {
	if l.floor.After(l.deadline) {
		return l.floor
	}
	return l.deadline
}

// LeaseSignal is the signal of an exit event whose rank its shim stopped
// because its lease ran out.
const LeaseSignal = "LEASE"

// leasePath is the lease file of one job attempt.
func (x *Executor) leasePath(job string, attempt uint32) string {
	return filepath.Join(x.runDir, job, "lease-"+strconv.FormatUint(uint64(attempt), 10))
}

// dropLease removes an attempt's lease file once none of its ranks
// runs here: no shim reads it any more, and run/<job>/ should not collect
// one file per attempt a long job ever had.
func (x *Executor) dropLease(job string, attempt uint32) {
	for _, p := range x.ranks[job] {
		if p.rec.Attempt == attempt && !p.exited() {
			return
		}
	}
	delete(x.lease.peer, attemptKey{job, attempt})
	if err := os.Remove(x.leasePath(job, attempt)); err != nil && !errors.Is(err, os.ErrNotExist) {
		x.log.Warn("remove lease file", "job", job, "attempt", attempt, "err", err)
	}
}

// dropStaleLeases removes, once the ranks are adopted, the lease
// files of attempts with no rank here: left by ranks that ended while
// nodemon was down (it never saw them exit) or by a nodemon older than
// this cleanup. No shim reads them any more.
func (x *Executor) dropStaleLeases() {
	paths, err := filepath.Glob(filepath.Join(x.runDir, "*", "lease-*"))
	if err != nil {
		return
	}
	for _, path := range paths {
		attempt, err := strconv.ParseUint(strings.TrimPrefix(filepath.Base(path), "lease-"), 10, 32)
		if err != nil {
			continue // not a lease file of ours
		}
		x.dropLease(filepath.Base(filepath.Dir(path)), uint32(attempt))
	}
}

// BeginLease starts a session with a server that grants leases of d (0:
// none): ranks launched in it start with a lease from start, when the
// node said hello.
func (x *Executor) BeginLease(d time.Duration, start time.Time) {
	x.do(func() (any, error) {
		x.lease.dur = d
		x.lease.floor = time.Time{}
		if d > 0 {
			x.lease.floor = start.Add(d)
		}
		return nil, nil
	})
}

// RenewLeases extends the lease of every live rank not fenced to
// deadline (a deadline no later than one already written changes
// nothing).
func (x *Executor) RenewLeases(deadline time.Time) {
	x.do(func() (any, error) {
		if x.lease.dur <= 0 || !deadline.After(x.lease.deadline) {
			return nil, nil
		}
		x.lease.deadline = deadline
		paths := map[string]time.Time{}
		for _, p := range x.live() {
			if !p.fenced && !p.rec.foreign() {
				k := attemptKey{p.rec.Job, p.rec.Attempt}
				paths[x.leasePath(k.job, k.attempt)] = x.lease.of(k)
			}
		}
		x.writeLeases(paths)
		return nil, nil
	})
}

func (x *Executor) writeLeases(paths map[string]time.Time) {
	for path, deadline := range paths {
		if err := writeLease(path, deadline); err != nil {
			x.log.Error("renew rank lease; its ranks stop when it runs out", "err", err)
		}
	}
}

// PeerAttempt is an attempt with live ranks here whose lease its
// witnesses may renew.
type PeerAttempt struct {
	Job       string
	Attempt   uint32
	Lease     time.Duration
	Witnesses []*api.Witness
}

// PeerAttempts lists the attempts whose ranks run here, not fenced, with
// witnesses and a lease.
func (x *Executor) PeerAttempts() []PeerAttempt {
	return query(x, func() []PeerAttempt {
		seen := map[attemptKey]bool{}
		var out []PeerAttempt
		for _, p := range x.live() {
			k := attemptKey{p.rec.Job, p.rec.Attempt}
			if p.fenced || p.rec.foreign() || len(p.rec.Witnesses) == 0 || p.rec.LeaseMs <= 0 || seen[k] {
				continue
			}
			seen[k] = true
			pa := PeerAttempt{Job: k.job, Attempt: k.attempt, Lease: time.Duration(p.rec.LeaseMs) * time.Millisecond}
			for _, w := range p.rec.Witnesses {
				pa.Witnesses = append(pa.Witnesses, &api.Witness{Name: w.Name, Addr: w.Addr})
			}
			out = append(out, pa)
		}
		slices.SortFunc(out, func(a, b PeerAttempt) int {
			return cmp.Or(cmp.Compare(a.Job, b.Job), cmp.Compare(a.Attempt, b.Attempt))
		})
		return out
	})
}

// RenewPeerLease extends one attempt's lease to deadline, which a quorum
// of its witnesses confirmed; a fenced attempt is never renewed.
func (x *Executor) RenewPeerLease(job string, attempt uint32, deadline time.Time) {
	x.do(func() (any, error) {
		x.renewPeerLease(attemptKey{job, attempt}, deadline)
		return nil, nil
	})
}

func (x *Executor) renewPeerLease(k attemptKey, deadline time.Time) {
	if !deadline.After(x.lease.peer[k]) {
		return
	}
	live := false
	for _, p := range x.ranks[k.job] {
		if p.rec.Attempt == k.attempt && !p.exited() && !p.fenced {
			live = true
		}
	}
	if !live {
		delete(x.lease.peer, k)
		return
	}
	if x.lease.peer == nil {
		x.lease.peer = map[attemptKey]time.Time{}
	}
	x.lease.peer[k] = deadline
	x.writeLeases(map[string]time.Time{x.leasePath(k.job, k.attempt): x.lease.of(k)})
}
