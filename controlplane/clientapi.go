package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// observeFlush is how often a following observer is sent what arrived.
const observeFlush = 100 * time.Millisecond

// serveClient answers a client's request streams until it disconnects.
func (s *Server) serveClient(ctx context.Context, conn *transport.Conn) {
	log := s.log.With("client", conn.Name(), "role", string(conn.Role()))
	for {
		st, err := conn.AcceptStream(ctx)
		if err != nil {
			return
		}
		if st.Kind() != transport.StreamRequest {
			log.Warn("client opened a non-request stream", "kind", st.Kind().String())
			st.Cancel(0)
			continue
		}
		go func() {
			if err := s.handleRequest(ctx, conn, st); err != nil {
				log.Debug("request ended", "err", err)
			}
			st.CloseWrite()
		}()
	}
}

// minRole is the least role allowed to make each request.
func minRole(req *api.ClientRequest) transport.Role {
	if r, ok := jobMinRole(req); ok {
		return r
	}
	if r, ok := identityMinRole(req); ok {
		return r
	}
	switch req.Body.(type) {
	case *api.ClientRequest_InjectFault:
		return transport.RoleAdmin
	case *api.ClientRequest_Cordon:
		return transport.RoleOperator
	}
	return transport.RoleViewer
}

func (s *Server) handleRequest(ctx context.Context, conn *transport.Conn, st *transport.Stream) error {
	var req api.ClientRequest
	st.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := st.Recv(&req); err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	st.SetReadDeadline(time.Time{})
	fail := func(format string, args ...any) error {
		return st.Send(&api.ClientResponse{Error: fmt.Sprintf(format, args...)})
	}
	if need := minRole(&req); !conn.Role().AtLeast(need) {
		return fail("permission denied: %T needs the %s role, your certificate has %s", req.Body, need, conn.Role())
	}
	if resp, ok := s.handleIdentity(ctx, conn, &req); ok {
		return st.Send(resp)
	}
	switch b := req.Body.(type) {
	case *api.ClientRequest_ListNodes:
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_ListNodes{ListNodes: &api.ListNodesResponse{Nodes: s.st.listNodes()}}})
	case *api.ClientRequest_ListEvents:
		evs, err := s.store.Events(store.EventFilter{Node: b.ListEvents.GetNode(), SinceUnixNano: b.ListEvents.GetSinceUnixNano(), Limit: int(b.ListEvents.GetLimit())})
		if err != nil {
			return fail("%v", err)
		}
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_ListEvents{ListEvents: &api.ListEventsResponse{Events: evs}}})
	case *api.ClientRequest_ListCollectives:
		job := b.ListCollectives.GetJob()
		if job != "" && s.jobs != nil {
			// Accept a job's name as well as its id; ranks carry the id.
			if j, err := s.jobs.lookup(job); err == nil {
				job = j.GetId()
			}
		}
		cs := s.st.listCollectives(job, b.ListCollectives.GetNode())
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_ListCollectives{ListCollectives: &api.ListCollectivesResponse{Collectives: cs}}})
	case *api.ClientRequest_GpuHistory:
		h, err := s.st.gpuHistory(b.GpuHistory.GetNode(), uint32(b.GpuHistory.GetGpuIndex()))
		if err != nil {
			return fail("%v", err)
		}
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_GpuHistory{GpuHistory: &api.GPUHistoryResponse{Samples: h}}})
	case *api.ClientRequest_InjectFault:
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := s.Command(cctx, b.InjectFault.GetNode(), &api.Command{Body: &api.Command_InjectFault{InjectFault: b.InjectFault.GetFault()}})
		if err != nil {
			return fail("inject fault: %v", err)
		}
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_InjectFault{InjectFault: &api.InjectFaultResponse{}}})
	case *api.ClientRequest_Observe:
		return s.observe(ctx, st, b.Observe)
	case *api.ClientRequest_ListStalls:
		stalls, err := s.Stalls(b.ListStalls.GetJob())
		if err != nil {
			return fail("%v", err)
		}
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_ListStalls{ListStalls: &api.ListStallsResponse{Stalls: stalls}}})
	case *api.ClientRequest_Cordon:
		r, err := s.cordon(b.Cordon)
		if err != nil {
			return fail("%s %s: %v", b.Cordon.GetAction(), b.Cordon.GetNode(), err)
		}
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_Cordon{Cordon: r}})
	case *api.ClientRequest_Logs:
		return s.logs(ctx, st, b.Logs)
	case *api.ClientRequest_SubmitJob, *api.ClientRequest_ListJobs, *api.ClientRequest_CancelJob,
		*api.ClientRequest_AssignJob, *api.ClientRequest_Rebalance,
		*api.ClientRequest_CheckpointJob, *api.ClientRequest_RestartJob:
		return st.Send(s.jobs.handle(ctx, conn.Name(), &req))
	}
	return fail("unknown request: this server speaks gpuctl protocol v%d.%d; upgrade it if the client is newer", api.ProtocolMajor, api.ProtocolMinor)
}

// observe streams history then, when following, live items in batches,
// each carrying the loss counters so the client can say what it missed.
func (s *Server) observe(ctx context.Context, st *transport.Stream, req *api.ObserveRequest) error {
	sub, past := s.st.obs.subscribe(req.GetFilter(), int(req.GetLast()), req.GetSinceUnixNano(), req.GetFollow())
	defer s.st.obs.unsubscribe(sub)
	const maxBatch = 2048
	for len(past) > 0 {
		n := min(len(past), maxBatch)
		if err := st.Send(&api.ClientResponse{Body: &api.ClientResponse_Observe{Observe: &api.ObserveBatch{
			Items: past[:n], LostAtNodes: s.st.obs.nodeLosses()}}}); err != nil {
			return err
		}
		past = past[n:]
	}
	if sub == nil {
		return st.Send(&api.ClientResponse{Body: &api.ClientResponse_Observe{Observe: &api.ObserveBatch{End: true, LostAtNodes: s.st.obs.nodeLosses()}}})
	}
	tick := time.NewTicker(observeFlush)
	defer tick.Stop()
	var batch []*api.ObserveItem
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-st.Context().Done():
			return nil
		case it := <-sub.ch:
			batch = append(batch, it)
			if len(batch) < maxBatch {
				continue
			}
		case <-tick.C:
		}
		if err := st.Send(&api.ClientResponse{Body: &api.ClientResponse_Observe{Observe: &api.ObserveBatch{
			Items: batch, LostByServer: sub.lost.Load(), LostAtNodes: s.st.obs.nodeLosses()}}}); err != nil {
			return err
		}
		batch = nil
	}
}
