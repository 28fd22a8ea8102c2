package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// observeFlush is how often a following observer is sent what arrived.
const observeFlush = 100 * time.Millisecond

// observe streams history then, when following, live items in batches,
// each carrying the loss counters so the client can say what it missed.
func (s *Server) observe(ctx context.Context, c *call) error {
	req := c.req.GetObserve()
	sub, past := s.obs.Subscribe(req.GetFilter(), int(req.GetLast()), req.GetSinceUnixNano(), req.GetFollow())
	defer s.obs.Unsubscribe(sub)
	const maxBatch = 2048
	send := func(b *api.ObserveBatch) error {
		return c.send(&api.ClientResponse{Body: &api.ClientResponse_Observe{Observe: b}})
	}
	for len(past) > 0 {
		n := min(len(past), maxBatch)
		if err := send(&api.ObserveBatch{Items: past[:n], LostAtNodes: s.obs.NodeLosses()}); err != nil {
			return err
		}
		past = past[n:]
	}
	if sub == nil {
		return send(&api.ObserveBatch{End: true, LostAtNodes: s.obs.NodeLosses()})
	}
	tick := time.NewTicker(observeFlush)
	defer tick.Stop()
	var batch []*api.ObserveItem
	for {
		select {
		case <-ctx.Done():
			return nil
		case it := <-sub.C:
			batch = append(batch, it)
			if len(batch) < maxBatch {
				continue
			}
		case <-tick.C:
		}
		if err := send(&api.ObserveBatch{Items: batch, LostByServer: sub.Lost(), LostAtNodes: s.obs.NodeLosses()}); err != nil {
			return err
		}
		batch = nil
	}
}

const (
	// logsPoll is how often a followed log is read again.
	logsPoll = 250 * time.Millisecond
	// logsChunk is the most one read asks a node for.
	logsChunk = 64 << 10
)

// rankNode returns the node that runs (or ran) rank of job's current
// attempt.
func rankNode(j *api.Job, rank int32) (string, error) {
	n := 0
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetRank() == rank {
				return jn.GetNode(), nil
			}
			n++
		}
	}
	if n == 0 {
		return "", fmt.Errorf("job %s is %s and placed nowhere: it has no logs until it starts", j.GetId(), j.GetState().Short())
	}
	return "", fmt.Errorf("job %s has no rank %d: its ranks are 0..%d", j.GetId(), rank, n-1)
}

// logs relays one rank's log from its node: everything from the start (or
// the last tail bytes), then, when following, what the rank writes next,
// until the client goes away or the job ends.
func (s *Server) logs(ctx context.Context, c *call) error {
	req := c.req.GetLogs()
	j, err := s.jobs.Lookup(req.GetJob())
	if err != nil {
		return c.fail("%v", err)
	}
	rank := req.GetRank()
	node, err := rankNode(j, rank)
	if err != nil {
		return c.fail("%v", err)
	}
	offset := int64(0)
	if req.GetTailBytes() > 0 {
		offset = -int64(req.GetTailBytes())
	}
	tick := time.NewTicker(logsPoll)
	defer tick.Stop()
	for {
		ended := j.GetState().Ended()
		for {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			ack, err := s.nodes.Command(cctx, node, &api.Command{Body: &api.Command_ReadLogs{ReadLogs: &api.ReadLogs{
				Job: j.GetId(), Rank: rank, Offset: offset, MaxBytes: logsChunk}}})
			cancel()
			if err != nil {
				return c.fail("read the log of rank %d of %s on %s: %v", rank, j.GetId(), node, err)
			}
			if len(ack.GetData()) > 0 {
				if err := c.send(&api.ClientResponse{Body: &api.ClientResponse_Logs{Logs: &api.LogsChunk{Data: ack.GetData(), Node: node}}}); err != nil {
					return err
				}
			}
			offset = ack.GetNextOffset()
			if len(ack.GetData()) < logsChunk {
				break
			}
		}
		if !req.GetFollow() || ended {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		if j, err = s.jobs.Lookup(j.GetId()); err != nil {
			return nil
		}
		// A restart elsewhere writes a new log there.
		if n, err := rankNode(j, rank); err == nil && n != node {
			node, offset = n, 0
		}
	}
}
