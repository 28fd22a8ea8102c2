// Package observe fans the traced NCCL calls and flows that nodes send out
// to the clients following them (gpuctl observe, the console), and keeps a
// bounded history for --last and --since.
package observe

import (
	"sync"
	"sync/atomic"

	"github.com/gpuctl/gpuctl/api"
)

// subscriberBuffer is how many items a slow observer may fall behind
// before further items are counted as lost to it.
const subscriberBuffer = 8192

// Broker fans traced calls and flows out to observers and keeps a bounded
// history for --last and --since.
type Broker struct {
	mu          sync.Mutex
	history     *ring
	subs        map[*Subscriber]struct{}
	lostAtNodes uint64
}

// Subscriber is one following observer.
type Subscriber struct {
	filter *api.ObserveFilter
	// C carries the items the observer wants.
	C    chan *api.ObserveItem
	lost atomic.Uint64
}

// Lost is how many items the subscriber missed because it fell behind.
func (s *Subscriber) Lost() uint64 { return s.lost.Load() }

// NewBroker returns a broker keeping historyLen recent items.
func NewBroker(historyLen int) *Broker {
	return &Broker{history: newRing(historyLen), subs: map[*Subscriber]struct{}{}}
}

// Publish records items and hands each to every observer that wants it,
// never blocking: an observer whose buffer is full has the item counted as
// lost, and is told so in its next batch.
func (b *Broker) Publish(items []*api.ObserveItem, lostAtNodes uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lostAtNodes = lostAtNodes
	for _, it := range items {
		b.history.push(it)
		for s := range b.subs {
			if !Matches(s.filter, it) {
				continue
			}
			select {
			case s.C <- it:
			default:
				s.lost.Add(1)
			}
		}
	}
}

// Subscribe registers an observer and returns, atomically with it, the
// matching history selected by last and since, so no item falls between.
func (b *Broker) Subscribe(f *api.ObserveFilter, last int, sinceUnixNano int64, follow bool) (*Subscriber, []*api.ObserveItem) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var past []*api.ObserveItem
	for i := b.history.len() - 1; i >= 0; i-- {
		it := b.history.at(i)
		if sinceUnixNano != 0 && itemTime(it) < sinceUnixNano {
			continue
		}
		if !Matches(f, it) {
			continue
		}
		past = append(past, it)
		if last > 0 && len(past) >= last {
			break
		}
	}
	for i, j := 0, len(past)-1; i < j; i, j = i+1, j-1 {
		past[i], past[j] = past[j], past[i]
	}
	if !follow {
		return nil, past
	}
	s := &Subscriber{filter: f, C: make(chan *api.ObserveItem, subscriberBuffer)}
	b.subs[s] = struct{}{}
	return s, past
}

// Unsubscribe ends a subscription.
func (b *Broker) Unsubscribe(s *Subscriber) {
	if s == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

// NodeLosses is the sum of the records every node reports it lost.
func (b *Broker) NodeLosses() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lostAtNodes
}

func itemTime(it *api.ObserveItem) int64 {
	if c := it.GetCollective(); c != nil {
		return c.GetStartUnixNano()
	}
	return it.GetFlow().GetTimeUnixNano()
}

// Matches applies an observe filter. With neither kind selected, both
// kinds pass; collective-only criteria exclude flows.
func Matches(f *api.ObserveFilter, it *api.ObserveItem) bool {
	if f == nil {
		return true
	}
	if f.Node != "" && it.GetNode() != f.Node {
		return false
	}
	wantColl, wantFlow := f.GetCollectives(), f.GetFlows()
	if !wantColl && !wantFlow {
		wantColl, wantFlow = true, true
	}
	if c := it.GetCollective(); c != nil {
		if !wantColl {
			return false
		}
		if f.Job != "" && c.GetJob() != f.Job {
			return false
		}
		if f.HasRank && c.GetRank() != f.Rank {
			return false
		}
		if f.Op != api.NCCLOp_NCCL_OP_UNSPECIFIED && c.GetOp() != f.Op {
			return false
		}
		if f.Comm != 0 && c.GetComm() != f.Comm {
			return false
		}
		if c.GetBytes() < f.MinBytes {
			return false
		}
		return c.GetDurationNs() >= f.SlowerThanNs
	}
	fl := it.GetFlow()
	if fl == nil || !wantFlow {
		return false
	}
	if f.Op != api.NCCLOp_NCCL_OP_UNSPECIFIED || f.Comm != 0 || f.SlowerThanNs != 0 {
		return false
	}
	if f.Job != "" && fl.GetJob() != f.Job {
		return false
	}
	if f.HasRank && fl.GetRank() != f.Rank {
		return false
	}
	return fl.GetTxBytes()+fl.GetRxBytes() >= f.MinBytes
}

// ring is a bounded FIFO of items that drops its oldest when full.
type ring struct {
	buf   []*api.ObserveItem
	start int
	n     int
}

func newRing(capacity int) *ring { return &ring{buf: make([]*api.ObserveItem, capacity)} }

func (r *ring) push(v *api.ObserveItem) {
	if len(r.buf) == 0 {
		return
	}
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = v
		r.n++
		return
	}
	r.buf[r.start] = v
	r.start = (r.start + 1) % len(r.buf)
}

func (r *ring) len() int { return r.n }

// at returns the i-th oldest item.
func (r *ring) at(i int) *api.ObserveItem { return r.buf[(r.start+i)%len(r.buf)] }
