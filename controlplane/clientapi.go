package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/controlplane/watch"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// Caller is who makes a request: a client certificate's name and role, or
// an SSH key's (the console served over SSH).
type Caller struct {
	Name string
	Role transport.Role
	// Via says how the caller authenticated: "cert" or "ssh".
	Via string
}

func (c Caller) String() string { return fmt.Sprintf("%s (%s, %s)", c.Name, c.Role, c.Via) }

// call is one request being answered.
type call struct {
	caller Caller
	req    *api.ClientRequest
	// send writes one answer; streaming requests send several.
	send func(*api.ClientResponse) error
}

func (c *call) fail(format string, args ...any) error {
	return c.send(&api.ClientResponse{Error: fmt.Sprintf(format, args...)})
}

// route is one row of the authorization table: the least role that may
// make the request (some requests need more when they change something),
// whether it changes the cluster (and is audited), and its handler.
type route struct {
	role    transport.Role
	mutates bool
	// escalate, when set, gives the role and mutation of a request whose
	// effect depends on its fields (a dry run is a look, an apply a change).
	escalate func(*api.ClientRequest) (transport.Role, bool)
	handle   func(s *Server, ctx context.Context, c *call) error
}

// requestName is a request's oneof field name (list_nodes, cordon, …).
func requestName(req *api.ClientRequest) protoreflect.Name {
	fd := req.ProtoReflect().WhichOneof(bodyOneof)
	if fd == nil {
		return ""
	}
	return fd.Name()
}

// retired are the request types no supported client sends any more, by
// their field number in ClientRequest (reserved there): a client that sends
// one is older than the server answers, and is told so.
var retired = map[protowire.Number]string{
	6: "create_token is the join-token request of gpuctl clients older than protocol v1.1, which this server no longer answers: upgrade gpuctl and run `gpuctl token create`",
}

// retiredRequest returns what to tell a client whose request is of a
// retired type, or "".
func retiredRequest(req *api.ClientRequest) string {
	b := req.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		if msg, ok := retired[num]; ok {
			return msg
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}

var bodyOneof = (&api.ClientRequest{}).ProtoReflect().Descriptor().Oneofs().ByName("body")

// routes is the authorization table. A request type missing from it is
// refused: the table fails closed.
var routes = map[protoreflect.Name]route{
	"list_nodes":       {role: transport.RoleViewer, handle: (*Server).listNodes},
	"list_events":      {role: transport.RoleViewer, handle: (*Server).listEvents},
	"list_collectives": {role: transport.RoleViewer, handle: (*Server).listCollectives},
	"gpu_history":      {role: transport.RoleViewer, handle: (*Server).gpuHistory},
	"observe":          {role: transport.RoleViewer, handle: (*Server).observe},
	"list_jobs":        {role: transport.RoleViewer, handle: (*Server).listJobs},
	"list_stalls":      {role: transport.RoleViewer, handle: (*Server).listStalls},
	"logs":             {role: transport.RoleViewer, handle: (*Server).logs},
	"watch":            {role: transport.RoleViewer, handle: (*Server).watch},
	"version":          {role: transport.RoleViewer, handle: (*Server).version},
	"status":           {role: transport.RoleViewer, handle: (*Server).status},
	"submit_job": {role: transport.RoleOperator, mutates: true, handle: (*Server).submitJob,
		escalate: func(r *api.ClientRequest) (transport.Role, bool) {
			if r.GetSubmitJob().GetDryRun() {
				return transport.RoleViewer, false
			}
			return transport.RoleOperator, true
		}},
	"rebalance": {role: transport.RoleOperator, mutates: true, handle: (*Server).rebalance,
		escalate: func(r *api.ClientRequest) (transport.Role, bool) {
			if !r.GetRebalance().GetApply() {
				return transport.RoleViewer, false
			}
			return transport.RoleOperator, true
		}},
	"cancel_job":        {role: transport.RoleOperator, mutates: true, handle: (*Server).cancelJob},
	"assign_job":        {role: transport.RoleOperator, mutates: true, handle: (*Server).assignJob},
	"checkpoint_job":    {role: transport.RoleOperator, mutates: true, handle: (*Server).checkpointJob},
	"restart_job":       {role: transport.RoleOperator, mutates: true, handle: (*Server).restartJob},
	"release_job":       {role: transport.RoleOperator, mutates: true, handle: (*Server).releaseJob},
	"quiet_slow":        {role: transport.RoleOperator, mutates: true, handle: (*Server).quietSlow},
	"cordon":            {role: transport.RoleOperator, mutates: true, handle: (*Server).cordon},
	"create_join_token": {role: transport.RoleAdmin, mutates: true, handle: (*Server).createJoinToken},
	"list_tokens":       {role: transport.RoleAdmin, handle: (*Server).listTokens},
	"revoke_token":      {role: transport.RoleAdmin, mutates: true, handle: (*Server).revokeTokenReq},
	"add_user":          {role: transport.RoleAdmin, mutates: true, handle: (*Server).addUserReq},
	"list_identities":   {role: transport.RoleAdmin, handle: (*Server).listIdentities},
	"revoke_user":       {role: transport.RoleAdmin, mutates: true, handle: (*Server).revokeUserReq},
	"remove_node":       {role: transport.RoleAdmin, mutates: true, handle: (*Server).removeNodeReq},
	"inject_fault":      {role: transport.RoleAdmin, mutates: true, handle: (*Server).injectFault},
}

// authorize returns the route for req and whether the caller may use it,
// with the reason when not.
func authorize(caller Caller, req *api.ClientRequest) (route, bool, error) {
	name := requestName(req)
	rt, ok := routes[name]
	if !ok {
		if name == "" {
			if retired := retiredRequest(req); retired != "" {
				return route{}, false, errors.New(retired)
			}
			return route{}, false, errors.New("empty request")
		}
		return route{}, false, fmt.Errorf("request %s is not one this server answers (gpuctl protocol v%d.%d): upgrade the server if the client is newer",
			name, api.ProtocolMajor, api.ProtocolMinor)
	}
	need, mutates := rt.role, rt.mutates
	if rt.escalate != nil {
		need, mutates = rt.escalate(req)
	}
	if !caller.Role.AtLeast(need) {
		return rt, mutates, fmt.Errorf("permission denied: %s needs the %s role, %s has %s", name, need, caller.Name, caller.Role)
	}
	return rt, mutates, nil
}

// dispatch answers one request through send: authorization first, then
// the handler, then, for a change, an audit event.
func (s *Server) dispatch(ctx context.Context, caller Caller, req *api.ClientRequest, send func(*api.ClientResponse) error) error {
	c := &call{caller: caller, req: req, send: send}
	rt, mutates, err := authorize(caller, req)
	if err != nil {
		if mutates {
			s.audit(caller, req, err)
		}
		return c.fail("%v", err)
	}
	if !mutates {
		return rt.handle(s, ctx, c)
	}
	if err := s.cfg.ReadOnly.Err(); err != nil {
		// Refused before it is tried: it could not be stored, and the
		// audit event could not be either, so it is logged.
		s.log.Info("change refused: read-only", "who", caller.Name, "request", string(requestName(req)), "reason", err)
		return c.fail("%v", err)
	}
	// A change is audited with its result: the error the caller was sent,
	// or ok.
	var answered error
	herr := rt.handle(s, ctx, &call{caller: caller, req: req, send: func(r *api.ClientResponse) error {
		if r.GetError() != "" && answered == nil {
			answered = errors.New(r.GetError())
		}
		return send(r)
	}})
	s.audit(caller, req, answered)
	return herr
}

// audit records a change a client asked for: who, what, and the result.
func (s *Server) audit(caller Caller, req *api.ClientRequest, result error) {
	name := string(requestName(req))
	what := summarize(req)
	res := "ok"
	sev := api.Severity_SEVERITY_INFO
	if result != nil {
		res, sev = result.Error(), api.Severity_SEVERITY_WARNING
	}
	e := &api.Event{TimeUnixNano: s.cfg.Now().UnixNano(), Kind: api.EventKind_EVENT_KIND_AUDIT, Severity: sev,
		Message: fmt.Sprintf("%s: %s %s: %s", caller, name, what, res),
		Attrs:   map[string]string{"who": caller.Name, "role": string(caller.Role), "via": caller.Via, "request": name, "result": res}}
	switch b := req.Body.(type) {
	case *api.ClientRequest_Cordon:
		e.Node = b.Cordon.GetNode()
	case *api.ClientRequest_InjectFault:
		e.Node = b.InjectFault.GetNode()
	case *api.ClientRequest_RemoveNode:
		e.Node = b.RemoveNode.GetName()
	case *api.ClientRequest_CancelJob:
		e.Job = b.CancelJob.GetJob()
	case *api.ClientRequest_AssignJob:
		e.Job = b.AssignJob.GetJob()
	case *api.ClientRequest_CheckpointJob:
		e.Job = b.CheckpointJob.GetJob()
	case *api.ClientRequest_RestartJob:
		e.Job = b.RestartJob.GetJob()
	case *api.ClientRequest_ReleaseJob:
		e.Job = b.ReleaseJob.GetJob()
	}
	if err := s.store.AppendEvent(e); err != nil {
		s.log.Error("persist audit event", "who", caller.Name, "request", name, "err", err)
		return
	}
	s.hub.PublishEvent(e)
}

// summarize is a request's fields in one short line for the audit log (a
// job file by its first lines only).
func summarize(req *api.ClientRequest) string {
	body := req.ProtoReflect().Get(req.ProtoReflect().WhichOneof(bodyOneof)).Message().Interface()
	if sj, ok := body.(*api.SubmitJobRequest); ok {
		sj = proto.Clone(sj).(*api.SubmitJobRequest)
		if y := sj.GetSpecYaml(); len(y) > 80 {
			sj.SpecYaml = y[:80] + "…"
		}
		body = sj
	}
	out := strings.TrimSpace(prototext.MarshalOptions{}.Format(body))
	if len(out) > 300 {
		out = out[:300] + "…"
	}
	return "{" + out + "}"
}

// ----------------------------------------------------------- QUIC side

// serveClient answers a client's request streams until it disconnects.
func (s *Server) serveClient(ctx context.Context, conn *transport.Conn) {
	log := s.log.With("client", conn.Name(), "role", string(conn.Role()))
	caller := Caller{Name: conn.Name(), Role: conn.Role(), Via: "cert"}
	s.clientsMu.Lock()
	s.clients[conn] = struct{}{}
	s.clientsMu.Unlock()
	defer func() {
		s.clientsMu.Lock()
		delete(s.clients, conn)
		s.clientsMu.Unlock()
	}()
	serveRequests(ctx, conn, log, func(ctx context.Context, req *api.ClientRequest, send func(*api.ClientResponse) error) error {
		return s.dispatch(ctx, caller, req, send)
	})
}

// serveRequests reads a client connection's request streams, one request
// each, and answers each with answer until the client disconnects.
func serveRequests(ctx context.Context, conn *transport.Conn, log *slog.Logger,
	answer func(ctx context.Context, req *api.ClientRequest, send func(*api.ClientResponse) error) error) {
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
			defer st.CloseWrite()
			var req api.ClientRequest
			st.SetReadDeadline(time.Now().Add(10 * time.Second))
			if err := st.Recv(&req); err != nil {
				log.Debug("read request", "err", err)
				return
			}
			// One request per stream: left unread, the client's end would
			// hold the stream open, and after 1024 requests (the stream
			// limit) the client could open no more.
			st.StopReading()
			rctx, cancel := context.WithCancel(ctx)
			defer cancel()
			stop := context.AfterFunc(st.Context(), cancel)
			defer stop()
			if err := answer(rctx, &req, func(r *api.ClientResponse) error { return st.Send(r) }); err != nil {
				log.Debug("request ended", "err", err)
			}
		}()
	}
}

// ------------------------------------------------------ in-process side

// LocalTransport is a client transport into this server acting as one
// caller: the console served over SSH uses it, so its requests go through
// the same authorization and audit as any client's. It satisfies
// client.Transport.
type LocalTransport struct {
	s      *Server
	caller Caller
}

// Local returns a transport that makes requests as caller.
func (s *Server) Local(caller Caller) *LocalTransport { return &LocalTransport{s: s, caller: caller} }

// Call answers req in-process, handing each answer to fn.
func (l *LocalTransport) Call(ctx context.Context, req *api.ClientRequest, fn func(*api.ClientResponse) error) error {
	var fnErr error
	err := l.s.dispatch(ctx, l.caller, proto.Clone(req).(*api.ClientRequest), func(r *api.ClientResponse) error {
		if fnErr = fn(r); fnErr != nil {
			return fnErr
		}
		return nil
	})
	switch {
	case fnErr != nil:
		return fnErr
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.Canceled):
		return nil
	}
	return err
}

// Close does nothing: the transport holds no connection.
func (l *LocalTransport) Close() error { return nil }

// -------------------------------------------------------------- handlers

func (s *Server) listNodes(_ context.Context, c *call) error {
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListNodes{ListNodes: &api.ListNodesResponse{Nodes: s.nodes.Nodes()}}})
}

func (s *Server) listEvents(_ context.Context, c *call) error {
	r := c.req.GetListEvents()
	if n := r.GetNode(); n != "" && !s.nodes.Known(n) {
		_, err := s.nodes.Node(n)
		return c.fail("%v", err)
	}
	evs, err := s.reads.Events(s.store, store.EventFilter{Node: r.GetNode(), SinceUnixNano: r.GetSinceUnixNano(), Limit: int(r.GetLimit())})
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListEvents{ListEvents: &api.ListEventsResponse{Events: evs}}})
}

func (s *Server) listCollectives(_ context.Context, c *call) error {
	r := c.req.GetListCollectives()
	job := r.GetJob()
	if job != "" {
		// Accept a job's name as well as its id; ranks carry the id.
		j, err := s.jobs.Lookup(job)
		if err != nil {
			return c.fail("%v", err)
		}
		job = j.GetId()
	}
	if n := r.GetNode(); n != "" {
		if _, err := s.nodes.Node(n); err != nil {
			return c.fail("%v", err)
		}
	}
	cs := s.nodes.Collectives(job, r.GetNode())
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListCollectives{ListCollectives: &api.ListCollectivesResponse{Collectives: cs}}})
}

func (s *Server) gpuHistory(_ context.Context, c *call) error {
	r := c.req.GetGpuHistory()
	h, err := s.nodes.GPUHistory(r.GetNode(), uint32(r.GetGpuIndex()))
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_GpuHistory{GpuHistory: &api.GPUHistoryResponse{Samples: h}}})
}

func (s *Server) listJobs(_ context.Context, c *call) error {
	js, err := s.jobs.List(c.req.GetListJobs().GetJob())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListJobs{ListJobs: &api.ListJobsResponse{Jobs: js}}})
}

func (s *Server) listStalls(_ context.Context, c *call) error {
	job := c.req.GetListStalls().GetJob()
	st, err := s.Stalls(job)
	if err != nil {
		return c.fail("%v", err)
	}
	slow, err := s.SlowFindings(job)
	if err != nil {
		return c.fail("%v", err)
	}
	late, err := s.RankLateness(job)
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListStalls{ListStalls: &api.ListStallsResponse{Stalls: st, Slow: slow,
		Lateness: late}}})
}

func (s *Server) watch(ctx context.Context, c *call) error {
	w := s.hub.Subscribe(c.req.GetWatch())
	defer w.Close()
	err := watch.Serve(ctx, w, s.cfg.WatchEvery, func(b *api.WatchBatch) error {
		return c.send(&api.ClientResponse{Body: &api.ClientResponse_Watch{Watch: b}})
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (s *Server) submitJob(ctx context.Context, c *call) error {
	r, err := s.jobs.Submit(ctx, c.req.GetSubmitJob(), string(c.caller.Role))
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_SubmitJob{SubmitJob: r}})
}

func (s *Server) cancelJob(ctx context.Context, c *call) error {
	j, err := s.jobs.Cancel(ctx, c.req.GetCancelJob().GetJob(), c.caller.Name)
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_CancelJob{CancelJob: &api.CancelJobResponse{Job: j}}})
}

func (s *Server) releaseJob(ctx context.Context, c *call) error {
	j, err := s.jobs.Release(ctx, c.req.GetReleaseJob().GetJob())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ReleaseJob{ReleaseJob: &api.ReleaseJobResponse{Job: j}}})
}

func (s *Server) assignJob(ctx context.Context, c *call) error {
	r := c.req.GetAssignJob()
	j, err := s.jobs.Assign(ctx, r.GetJob(), r.GetNodes())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_AssignJob{AssignJob: &api.AssignJobResponse{Job: j}}})
}

func (s *Server) rebalance(ctx context.Context, c *call) error {
	r, err := s.jobs.Rebalance(ctx, c.req.GetRebalance())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_Rebalance{Rebalance: r}})
}

func (s *Server) checkpointJob(ctx context.Context, c *call) error {
	j, err := s.jobs.Checkpoint(ctx, c.req.GetCheckpointJob().GetJob())
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_CheckpointJob{CheckpointJob: &api.CheckpointJobResponse{Job: j}}})
}

func (s *Server) restartJob(ctx context.Context, c *call) error {
	r := c.req.GetRestartJob()
	j, err := s.jobs.Restart(ctx, r.GetJob(), r.GetFromCheckpoint(), r.GetExclude(), c.caller.Name)
	if err != nil {
		return c.fail("%v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_RestartJob{RestartJob: &api.RestartJobResponse{Job: j}}})
}

// cordon answers gpuctl cordon, uncordon and drain. The node's new state
// is stored before the answer; a drain also queues moves of the jobs
// running there.
func (s *Server) cordon(ctx context.Context, c *call) error {
	r := c.req.GetCordon()
	if r.GetNode() == "" {
		return c.fail("%s: no node named: `gpuctl nodes` lists them", r.GetAction())
	}
	switch r.GetAction() {
	case nodes.ActionCordon, nodes.ActionUncordon, nodes.ActionDrain:
	default:
		// Suspicion is recovery's to mark and validation's to lift.
		return c.fail("unknown node action %q: use cordon, uncordon or drain", r.GetAction())
	}
	// A reason is data: bounded, and stripped of what a terminal would obey.
	n, err := s.nodes.SetCordon(r.GetNode(), r.GetAction(), api.CleanText(r.GetReason(), 0))
	if err != nil {
		return c.fail("%s %s: %v", r.GetAction(), r.GetNode(), err)
	}
	resp := &api.CordonResponse{Node: n}
	switch r.GetAction() {
	case nodes.ActionDrain:
		if resp.Jobs, err = s.jobs.Drain(ctx, r.GetNode()); err != nil {
			return c.fail("drain %s: cordoned, but its jobs could not be planned: %v", r.GetNode(), err)
		}
	case nodes.ActionUncordon:
		// Pending jobs may fit now.
		s.jobs.Kick()
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_Cordon{Cordon: resp}})
}

func (s *Server) injectFault(ctx context.Context, c *call) error {
	r := c.req.GetInjectFault()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.nodes.Command(cctx, r.GetNode(), &api.Command{Body: &api.Command_InjectFault{InjectFault: r.GetFault()}}); err != nil {
		return c.fail("inject fault: %v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_InjectFault{InjectFault: &api.InjectFaultResponse{}}})
}

func (s *Server) version(_ context.Context, c *call) error {
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_Version{Version: &api.VersionResponse{
		Software: api.Release, Commit: s.cfg.Commit, Protocol: api.CurrentVersion()}}})
}
