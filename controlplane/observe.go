package controlplane

import (
	"sync"
	"sync/atomic"

	"github.com/gpuctl/gpuctl/api"
)

// subscriberBuffer is how many items a slow observer may fall behind
// before further items are counted as lost to it.
const subscriberBuffer = 8192

// broker fans traced calls and flows out to observers and keeps a bounded
// history for --last and --since.
type broker struct {
	mu          sync.Mutex
	history     *ring[*api.ObserveItem]
	subs        map[*subscriber]struct{}
	lostAtNodes uint64
}

type subscriber struct {
	filter *api.ObserveFilter
	ch     chan *api.ObserveItem
	lost   atomic.Uint64
}

func newBroker(historyLen int) *broker {
	return &broker{history: newRing[*api.ObserveItem](historyLen), subs: map[*subscriber]struct{}{}}
}

// publish records items and hands each to every observer that wants it,
// never blocking: an observer whose buffer is full has the item counted as
// lost, and is told so in its next batch.
func (b *broker) publish(items []*api.ObserveItem, lostAtNodes uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lostAtNodes = lostAtNodes
	for _, it := range items {
		b.history.push(it)
		for s := range b.subs {
			if !matches(s.filter, it) {
				continue
			}
			select {
			case s.ch <- it:
			default:
				s.lost.Add(1)
			}
		}
	}
}

// subscribe registers an observer and returns, atomically with it, the
// matching history selected by last and since, so no item falls between.
func (b *broker) subscribe(f *api.ObserveFilter, last int, sinceUnixNano int64, follow bool) (*subscriber, []*api.ObserveItem) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var past []*api.ObserveItem
	for i := b.history.len() - 1; i >= 0; i-- {
		it := b.history.at(i)
		if sinceUnixNano != 0 && itemTime(it) < sinceUnixNano {
			continue
		}
		if !matches(f, it) {
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
	s := &subscriber{filter: f, ch: make(chan *api.ObserveItem, subscriberBuffer)}
	b.subs[s] = struct{}{}
	return s, past
}

func (b *broker) unsubscribe(s *subscriber) {
	if s == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.subs, s)
}

func (b *broker) nodeLosses() uint64 {
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

// matches applies an observe filter. With neither kind selected, both
// kinds pass; collective-only criteria exclude flows.
func matches(f *api.ObserveFilter, it *api.ObserveItem) bool {
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
