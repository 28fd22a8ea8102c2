package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// Standby is a server of a highly available control plane that does not
// lead: it holds no job loop and writes nothing. It answers reads from the
// shared store and tells nodes and clients where the leader is, so that
// they move there; when it wins the election it is closed and a Server
// takes its address.
type Standby struct {
	cfg    Config
	log    *slog.Logger
	leader func() *api.ServerStatus
	ln     *transport.Listener
	wg     sync.WaitGroup
	// reads answers from the last read while the store is away.
	reads lastRead
}

// standbyReads are the requests a standby answers itself, from the store;
// every other request is sent back with the leader's address. Who may make
// them is still the authorization table's rule (routes).
var standbyReads = map[protoreflect.Name]func(*Standby, context.Context, *call) error{
	"status":      (*Standby).status,
	"version":     (*Standby).version,
	"list_nodes":  (*Standby).listNodes,
	"list_jobs":   (*Standby).listJobs,
	"list_events": (*Standby).listEvents,
}

// NewStandby makes a standby over cfg.Store and cfg.Authority (both
// required: a standby shares the leader's); leader says who leads now
// (nil: nobody, an election is under way).
func NewStandby(cfg Config, leader func() *api.ServerStatus) (*Standby, error) {
	if cfg.Store == nil || cfg.Authority == nil {
		return nil, errors.New("standby: needs the shared store and the cluster authority")
	}
	if cfg.Listen == "" {
		cfg.Listen = ":7443"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Standby{cfg: cfg, log: cfg.Log.With("part", "standby"), leader: leader}, nil
}

// Listen binds the UDP port.
func (sb *Standby) Listen(ctx context.Context) error {
	ln, err := transport.Listen(ctx, sb.cfg.Listen, sb.cfg.Authority, transport.ListenConfig{
		Logger: sb.log, Standby: sb.notLeaderError, CheckPeer: sb.checkPeer})
	if err != nil {
		return fmt.Errorf("standby: %w", err)
	}
	sb.ln = ln
	return nil
}

// Addr is the bound UDP address.
func (sb *Standby) Addr() net.Addr { return sb.ln.Addr() }

// Serve answers connections until ctx ends; then the port is free for
// the Server that takes over.
func (sb *Standby) Serve(ctx context.Context) error {
	if sb.ln == nil {
		if err := sb.Listen(ctx); err != nil {
			return err
		}
	}
	defer sb.wg.Wait()
	for {
		conn, err := sb.ln.Accept(ctx)
		if err != nil {
			sb.ln.Close()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("standby: %w", err)
		}
		sb.wg.Add(1)
		go func() {
			defer sb.wg.Done()
			if conn.Role() == transport.RoleNode {
				sb.redirectNode(ctx, conn)
				return
			}
			sb.serveClient(ctx, conn)
		}()
	}
}

// leaderAddr is where the leader listens, "" while none is elected.
func (sb *Standby) leaderAddr() string { return sb.leader().GetAddr() }

// notLeader says what a standby cannot do and where to go instead.
func (sb *Standby) notLeader(what string) string {
	if l := sb.leader(); l != nil {
		return fmt.Sprintf("this server is a standby: %s is done by the leader, %s at %s", what, l.GetName(), l.GetAddr())
	}
	return fmt.Sprintf("this server is a standby and no leader is elected right now: %s must wait for one; try again in a few seconds", what)
}

// redirectNode answers a node's hello with the leader's address and
// closes: the node registers with the leader, which alone owns node state.
func (sb *Standby) redirectNode(ctx context.Context, conn *transport.Conn) {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := conn.AcceptStream(hctx)
	if err != nil {
		conn.CloseWithError(transport.CodeProtocol, "no control stream")
		return
	}
	st.SetReadDeadline(time.Now().Add(5 * time.Second))
	var hello api.AgentMessage
	if err := st.Recv(&hello); err != nil || hello.GetHello() == nil {
		conn.CloseWithError(transport.CodeProtocol, "first message is not a hello")
		return
	}
	msg := sb.notLeader("a node's session")
	st.Send(&api.ServerMessage{Body: &api.ServerMessage_Welcome{Welcome: &api.Welcome{
		Version: api.CurrentVersion(), Error: msg, LeaderAddr: sb.leaderAddr()}}})
	st.CloseWrite()
	// Give the welcome time to reach the node before the close overtakes it.
	select {
	case <-st.Context().Done():
	case <-time.After(time.Second):
	}
	conn.CloseWithError(transport.CodeBusy, msg)
	sb.log.Debug("node sent to the leader", "node", conn.Name(), "leader", sb.leaderAddr())
}

// notLeaderError sends joins to the leader: a join writes the token
// ledger, which only the leader may.
func (sb *Standby) notLeaderError() *transport.NotLeaderError {
	return &transport.NotLeaderError{Leader: sb.leaderAddr(), Reason: sb.notLeader("joining the cluster")}
}

// checkPeer refuses a certificate on the shared deny-list, as the leader
// would (as last read while the store is away); unlike the leader it
// records nothing.
func (sb *Standby) checkPeer(_ context.Context, p transport.PeerInfo) error {
	ids, ok := sb.cfg.Store.(store.IdentityStore)
	if !ok {
		return nil
	}
	return sb.reads.checkDenyList(ids, p)
}

// serveClient answers a client's request streams until it disconnects.
func (sb *Standby) serveClient(ctx context.Context, conn *transport.Conn) {
	caller := Caller{Name: conn.Name(), Role: conn.Role(), Via: "cert"}
	serveRequests(ctx, conn, sb.log.With("client", conn.Name()), func(ctx context.Context, req *api.ClientRequest, send func(*api.ClientResponse) error) error {
		return sb.dispatch(ctx, caller, req, send)
	})
}

// dispatch authorizes req by the same table as the leader, answers the
// reads a standby can, and sends the rest back with the leader's address,
// not acted on.
func (sb *Standby) dispatch(ctx context.Context, caller Caller, req *api.ClientRequest, send func(*api.ClientResponse) error) error {
	c := &call{caller: caller, req: req, send: send}
	if _, _, err := authorize(caller, req); err != nil {
		return c.fail("%v", err)
	}
	name := requestName(req)
	if read, ok := standbyReads[name]; ok {
		return read(sb, ctx, c)
	}
	return send(&api.ClientResponse{Error: sb.notLeader(string(name)), LeaderAddr: sb.leaderAddr()})
}

func (sb *Standby) status(ctx context.Context, c *call) error {
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_Status{Status: statusOf(ctx, sb.cfg)}})
}

func (sb *Standby) version(_ context.Context, c *call) error {
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_Version{Version: &api.VersionResponse{
		Software: api.Release, Commit: sb.cfg.Commit, Protocol: api.CurrentVersion()}}})
}

// listNodes answers from the store: the nodes as the leader last wrote
// them (liveness and cordons; live figures are the leader's alone). The
// reads of a standby answer as last read while the store is away.
func (sb *Standby) listNodes(_ context.Context, c *call) error {
	ns, err := sb.reads.Nodes(sb.cfg.Store)
	if err != nil {
		return c.fail("standby: read nodes from the store: %v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListNodes{ListNodes: &api.ListNodesResponse{Nodes: ns}}})
}

func (sb *Standby) listJobs(_ context.Context, c *call) error {
	js, err := sb.reads.Jobs(sb.cfg.Store)
	if err != nil {
		return c.fail("standby: read jobs from the store: %v", err)
	}
	if want := c.req.GetListJobs().GetJob(); want != "" {
		match := api.MatchJobs(js, want)
		if len(match) == 0 {
			return c.fail("job %q not found", want)
		}
		js = match
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListJobs{ListJobs: &api.ListJobsResponse{Jobs: js}}})
}

func (sb *Standby) listEvents(_ context.Context, c *call) error {
	r := c.req.GetListEvents()
	evs, err := sb.reads.Events(sb.cfg.Store, store.EventFilter{Node: r.GetNode(), SinceUnixNano: r.GetSinceUnixNano(), Limit: int(r.GetLimit())})
	if err != nil {
		return c.fail("standby: read events from the store: %v", err)
	}
	return c.send(&api.ClientResponse{Body: &api.ClientResponse_ListEvents{ListEvents: &api.ListEventsResponse{Events: evs}}})
}
