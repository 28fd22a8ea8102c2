// Package jobs owns the control plane's job state: jobs, their attempts,
// recoveries, moves and validation gangs. One goroutine owns all of it, as
// etcd's server applies every change in one loop: node sessions, the
// detectors and client requests send it typed messages, which it applies in
// the order they came, then writes what changed in one store transaction,
// and only then acts (commands to nodes) and answers. Nothing else reads or
// writes a job; readers get the committed copies through View.
//
// Manager is the loop, the transaction and the requests; the work is done
// by its parts, each a type in its own file with the state it keeps
// (placer, stopper, launcher, recoverer, gangs, fencer, nodeWatch,
// progressTable, stallWatch, executorWatch, intake). They hold the
// Manager for the jobs and the current step, and run on its goroutine
// only: no part has a lock or a goroutine of its own.
package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/jobspec"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/carbon"
	"github.com/gpuctl/gpuctl/scheduler/failslow"
	predictor "github.com/gpuctl/gpuctl/scheduler/predict"
	"github.com/gpuctl/gpuctl/store"
)

// Nodes is what the job owner needs of the node registry.
type Nodes interface {
	// Nodes returns every node's status (shared, read-only).
	Nodes() []*api.NodeStatus
	// Ranks returns, per node that is up, its ranks of job ("" = all).
	Ranks(job string) []nodes.NodeRanks
	// Command sends one command to a node and waits for its ack.
	Command(ctx context.Context, node string, c *api.Command) (*api.CommandAck, error)
	// SetCordon cordons (or drains, uncordons) a node with a reason.
	SetCordon(node, action, reason string) (*api.NodeStatus, error)
}

// Observer hears what the owner measures of itself, for metrics.
type Observer interface {
	// ObserveSchedulerPass is one scheduling pass's duration and the
	// jobs left queued after it.
	ObserveSchedulerPass(d time.Duration, queued int)
	// ObserveRecoveryStep is one recovery step (stopped, decided,
	// validated, relaunched) and how long the recovery had taken by it.
	ObserveRecoveryStep(step string, d time.Duration)
}

// Publisher takes every committed job and persisted event, for watch
// streams; the objects are never modified afterwards.
type Publisher interface {
	PublishJob(j *api.Job)
	PublishEvent(e *api.Event)
}

// Config tunes the job owner; zero fields take the defaults noted.
type Config struct {
	Store store.Store
	Nodes Nodes
	// Front is the owner's front door, when something (the node
	// registry) needed it before the owner was built; nil: New makes one.
	Front *Front
	// Publish may be nil.
	Publish Publisher
	// Policy orders the queue, default scheduler's default policy.
	Policy scheduler.Policy
	// Intensity is the carbon intensity by node label, for jobs'
	// emissions; nil: none (jobs report energy only).
	Intensity *carbon.Intensities
	// Every is the scheduling period, default 1 s; changes also start a
	// pass.
	Every time.Duration
	// Runtimes predicts the runtime of a submitted job whose file gives
	// none (estimated_runtime), for SJF and backfill; nil: none.
	Runtimes *predictor.Model
	// PortBase and PortRange bound the ports handed to jobs (a pair each,
	// MASTER_PORT and MASTER_PORT+1), default 29500 and 1000.
	PortBase, PortRange int
	// CheckpointRoot holds <job>/ for jobs that name no checkpoint dir.
	CheckpointRoot string
	// MoveGrace is how long a move waits for its checkpoint before it
	// stops the ranks anyway, default 2 min.
	MoveGrace time.Duration
	// KillAfter is how long ranks have after SIGTERM before SIGKILL,
	// default 30 s.
	KillAfter time.Duration
	// CommandTimeout bounds one command to one node, default 10 s.
	CommandTimeout time.Duration
	// SignalTimeout bounds a signal to one node, default 2 s: stops
	// resend, and a failed node must not hold up the others.
	SignalTimeout time.Duration
	// MaxMoves bounds a rebalance plan, default 8.
	MaxMoves int
	// MaxExplained bounds how many pending jobs per pass get a placer
	// explanation, default 64; the rest read "queued".
	MaxExplained int
	// ValidateCommand is the short all-reduce run on nodes new to a
	// recovering job before it lands there (one rank per node); empty
	// skips it, leaving NVML health as the only check.
	ValidateCommand []string
	// ValidateTimeout bounds a validation gang, default 30 s.
	ValidateTimeout time.Duration
	// MaxValidations bounds the validation rounds of one recovery, default 3.
	MaxValidations int
	// RecoveryKillAfter is how long a recovering job's surviving ranks
	// have after SIGTERM before SIGKILL, default 5 s: they are stuck in a
	// collective with a dead peer, not saving anything.
	RecoveryKillAfter time.Duration
	// ReconnectGrace is added to twice a node's heartbeat to bound how long
	// after the server starts a node that holds live ranks may take to
	// reconnect before it counts as down; default DefaultReconnectGrace.
	ReconnectGrace time.Duration
	// Lease is how long a node's ranks run on without the server's word
	// (nodes.Config.Lease); 0: nodes do not fence themselves, and a lost
	// node's attempt is relaunched without waiting for it.
	Lease time.Duration
	// RunAs decides which accounts a submitter may have ranks run as, and
	// the default account.
	RunAs jobspec.RunAsPolicy
	// Executor, when set, launches and signals attempts (Slurm); nil:
	// nodemon does, through the dispatcher.
	Executor Executor
	// ReadOnly, when set and not nil, is why nothing may be stored now
	// (the store is away): the owner then applies what it hears but
	// neither schedules nor tries to commit, keeping the step's writes and
	// commands until it may; requests are refused with the reason.
	ReadOnly func() error
	// SlowRule bounds automatic action on fail-slow findings, default
	// scheduler.DefaultSlowRule.
	SlowRule scheduler.SlowRule
	// Now is the clock, default time.Now.
	Now func() time.Time
	Log *slog.Logger
}

func (c *Config) defaults() {
	if c.Policy == nil {
		c.Policy, _ = scheduler.PolicyByName(scheduler.DefaultPolicy)
	}
	if c.Every <= 0 {
		c.Every = time.Second
	}
	if c.SlowRule == (scheduler.SlowRule{}) {
		c.SlowRule = scheduler.DefaultSlowRule()
	}
	if c.PortBase <= 0 {
		c.PortBase = 29500
	}
	if c.PortRange <= 0 {
		c.PortRange = 1000
	}
	if c.MoveGrace <= 0 {
		c.MoveGrace = 2 * time.Minute
	}
	if c.KillAfter <= 0 {
		c.KillAfter = 30 * time.Second
	}
	if c.CommandTimeout <= 0 {
		c.CommandTimeout = 10 * time.Second
	}
	if c.SignalTimeout <= 0 {
		c.SignalTimeout = 2 * time.Second
	}
	if c.MaxMoves <= 0 {
		c.MaxMoves = 8
	}
	if c.MaxExplained <= 0 {
		c.MaxExplained = 64
	}
	if c.ValidateTimeout <= 0 {
		c.ValidateTimeout = 30 * time.Second
	}
	if c.MaxValidations <= 0 {
		c.MaxValidations = 3
	}
	if c.RecoveryKillAfter <= 0 {
		c.RecoveryKillAfter = 5 * time.Second
	}
	if c.ReconnectGrace <= 0 {
		c.ReconnectGrace = DefaultReconnectGrace
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// entry is one job: the working record the owner changes, the copy last
// committed (shared with readers), and its parsed job file.
type entry struct {
	job       *api.Job
	committed *api.Job
	// spec is nil only for a stored job whose file no longer parses; such
	// a job is failed on load.
	spec *jobspec.Spec
	// resume, when resumeSet, is the step the next start resumes from
	// (recovery decided it); otherwise the latest checkpoint is used.
	resume    int64
	resumeSet bool
	// killSent is set once a stop has sent SIGKILL.
	killSent bool
	// resizeWhy, when set, is why the next start changes the job's size.
	resizeWhy string
	// fences are the lost nodes that may still run an old attempt of the
	// job: no new attempt starts until each is fenced.
	fences map[string]fence
	// supersedeSent is when each witness of a fence was last told.
	supersedeSent map[string]time.Time
	// retryAt, when set, is when a job the executor could not start is
	// tried again (retryWhy says why it waits); retries counts the
	// failures in a row, for the backoff.
	retryAt  time.Time
	retryWhy string
	retries  int
}

// Manager is the job owner: its loop, its transaction and the parts that
// do the work.
type Manager struct {
	// Front is the owner's queue and its committed view.
	*Front
	cfg  Config
	log  *slog.Logger
	disp *dispatcher
	obs  atomic.Pointer[Observer]

	// Everything below belongs to the loop goroutine.
	jobs map[string]*entry
	// exec applies what an outside executor reports.
	exec executorWatch
	// rec carries out recoveries and keeps their progress.
	rec recoverer
	// gangs keeps the validation gangs in flight.
	gangs gangs
	// fence keeps lost nodes from running an old attempt twice.
	fence fencer
	// nodes applies what the nodes report.
	nodes nodeWatch
	// placer runs the scheduler and applies its decisions.
	placer placer
	// stops stops jobs and keeps the moves to come.
	stops stopper
	// launcher starts and signals attempts.
	launcher launcher
	// stall applies the stall detector's findings.
	stall stallWatch
	// prog keeps the running jobs' counters between passes.
	prog progressTable
	// intake takes submitted jobs in.
	intake intake
	// pass gathers the writes, events and commands of the loop's current
	// step until they are committed together.
	pass *txn
	// startedAt is when the server started (the owner's loop began; New
	// until then): nodes holding ranks must reconnect within their
	// reconnect bound of it.
	startedAt time.Time
	kicked    bool
	// strict makes a transition the lifecycle table does not allow panic
	// (tests); otherwise it is logged.
	strict bool
}

// New loads every stored job. A job whose stored file no longer parses
// cannot be launched again, so it is failed (with why) rather than
// silently dropped.
func New(cfg Config) (*Manager, error) {
	cfg.defaults()
	front := cfg.Front
	if front == nil {
		front = NewFront()
	}
	m := &Manager{Front: front, cfg: cfg, log: cfg.Log, jobs: map[string]*entry{}, pass: &txn{}, startedAt: cfg.Now()}
	m.rec = recoverer{m: m, recs: map[string]*recovery{}}
	m.gangs = gangs{m: m, byID: map[string]*validation{}}
	m.fence = fencer{m: m}
	m.intake = intake{m: m, idem: map[string]string{}}
	m.exec = executorWatch{m: m}
	m.stall = stallWatch{m: m}
	m.prog = progressTable{m: m, byJob: map[string]*progress{}}
	m.nodes = nodeWatch{m: m}
	m.placer = placer{m: m}
	m.stops = stopper{m: m}
	m.launcher = launcher{m: m, waiting: map[launchKey][]chan reply{}}
	m.disp = newDispatcher(cfg.Nodes.Command, cfg.Log)
	m.disp.exec = cfg.Executor
	stored, err := cfg.Store.Jobs()
	if err != nil {
		return nil, fmt.Errorf("load jobs: %w", err)
	}
	now := m.now()
	for _, j := range stored {
		en := &entry{job: j, committed: proto.Clone(j).(*api.Job)}
		m.jobs[j.GetId()] = en
		if key := j.GetIdempotencyKey(); key != "" {
			m.intake.idem[key] = j.GetId()
		}
		spec, err := jobspec.Parse(j.GetSpecSource(), []byte(j.GetSpecYaml()))
		if err == nil {
			en.spec = spec
		} else if !j.GetState().Ended() {
			m.rec.giveUp(en, fmt.Sprintf("stored job file no longer parses: %v", err), now)
		}
		if en.spec != nil && j.GetState() == api.JobState_JOB_STATE_RECOVERING {
			// The recovery restarts from its first step: stop what is
			// left, choose nodes, validate, relaunch.
			m.rec.recs[j.GetId()] = &recovery{failure: scheduler.Failure{Kind: scheduler.FailRankExit}, reason: strings.TrimPrefix(j.GetReason(), "recovering: "),
				since: now, stepAt: j.GetStep(), resume: -1, cordon: map[string]string{}}
		}
		if !j.GetState().Ended() {
			// Not only a recovery: a move or a preemption under way also
			// starts its job again, and must wait for its lost nodes.
			m.fence.afterLoad(en, now)
		}
	}
	if err := m.commit(m.pass); err != nil {
		return nil, fmt.Errorf("load jobs: %w", err)
	}
	m.publishView()
	return m, nil
}

func (m *Manager) now() time.Time { return m.cfg.Now() }

// Run owns the jobs until ctx ends: it applies messages as they come and
// schedules every period and after every change.
func (m *Manager) Run(ctx context.Context) {
	// Nodes can reach the server only from now on; loading the store may
	// have taken a while.
	m.startedAt = m.now()
	m.disp.start(ctx)
	t := time.NewTicker(m.cfg.Every)
	defer t.Stop()
	due := true
	for {
		m.step(due)
		due = false
		select {
		case <-ctx.Done():
			m.launcher.failWaiting("the server is stopping")
			return
		case <-t.C:
			due = true
		case <-m.in.sig:
		}
	}
}

// step applies the queued messages, runs a scheduling pass when one is
// due or something asked for one, and commits.
func (m *Manager) step(pass bool) {
	for _, msg := range m.in.drain() {
		m.handle(msg)
	}
	if m.readOnly() != nil {
		// Kept, unscheduled and uncommitted, until the store is back:
		// what happened meanwhile is then stored and acted on in order.
		return
	}
	if pass || m.kicked {
		m.kicked = false
		start := time.Now()
		m.reconcile()
		if o := m.observer(); o != nil {
			o.ObserveSchedulerPass(time.Since(start), m.queued())
		}
	}
	if err := m.commit(m.pass); err != nil {
		// Kept, with its commands, for the next step: nothing is acted
		// on before it is stored.
		m.log.Error("commit job changes; retrying on the next pass", "err", err)
	}
}

// readOnly is Config.ReadOnly's answer, nil without one.
func (m *Manager) readOnly() error {
	if m.cfg.ReadOnly == nil {
		return nil
	}
	return m.cfg.ReadOnly()
}

// kick asks for a scheduling pass in this step.
func (m *Manager) kick() { m.kicked = true }

// ------------------------------------------------------------ messages

// inbox is the owner's queue: senders never block, and messages are
// applied in the order they were posted.
type inbox struct {
	mu  sync.Mutex
	q   []any
	sig chan struct{}
}

func (b *inbox) post(msg any) {
	b.mu.Lock()
	b.q = append(b.q, msg)
	b.mu.Unlock()
	select {
	case b.sig <- struct{}{}:
	default:
	}
}

func (b *inbox) drain() []any {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.q
	b.q = nil
	return q
}

type (
	msgNodeUp struct {
		node string
		reg  *api.NodeRegistration
	}
	msgNodeDown   struct{ node, reason string }
	msgNodeEvents struct {
		node   string
		events []*api.Event
	}
	msgLaunched struct {
		job     string
		attempt uint32
		errs    map[string]error
	}
	msgValidationLaunched struct {
		gang string
		errs map[string]error
	}
	msgCordoned struct {
		job, node, reason string
		// action is nodes.ActionCordon, or ActionSuspect for a lost node;
		// node is its status after.
		action string
		status *api.NodeStatus
		took   time.Duration
		err    error
	}
	msgStalls struct {
		declared []*api.Stall
		stalled  map[string]bool
		events   []*api.Event
		slow     []failslow.Finding
		done     chan struct{}
	}
	msgCall struct {
		fn    func() (any, error)
		reply chan reply
	}
	msgFenced struct {
		node, job string
		attempt   uint32
		killed    []*api.RankStatus
	}
	// msgSuperseded is a witness's answer to a Supersede.
	msgSuperseded struct {
		job, witness string
		attempt      uint32
		received     time.Time
		ago          time.Duration
		err          error
	}
)

type reply struct {
	v   any
	err error
}

// deferred is what a request returns when its answer waits for a launch
// to be acknowledged by the nodes.
type deferred struct{ key launchKey }

type launchKey struct {
	job     string
	attempt uint32
}

func (m *Manager) handle(msg any) {
	switch msg := msg.(type) {
	case msgNodeUp:
		m.nodes.up(msg.node, msg.reg)
	case msgNodeDown:
		m.nodes.down(msg.node, msg.reason, m.now())
		m.kick()
	case msgNodeEvents:
		for _, e := range msg.events {
			m.nodes.apply(e)
		}
	case msgLaunched:
		m.launcher.launched(msg)
	case msgValidationLaunched:
		m.gangs.launched(msg)
	case msgCordoned:
		m.rec.cordoned(msg)
	case msgStalls:
		m.stall.apply(msg)
	case msgCall:
		m.call(msg)
	case msgFenced:
		m.fence.fenced(msg)
	case msgSuperseded:
		m.fence.superseded(msg)
	case msgExecutorFailed:
		m.exec.failed(msg)
	case msgExternal:
		m.exec.external(msg)
	case msgPlaced:
		m.exec.placed(msg)
	default:
		m.log.Error("job owner got an unknown message", "type", fmt.Sprintf("%T", msg))
	}
}

// do runs fn on the owner and returns its answer once its changes are
// committed (or why they could not be).
func (m *Manager) do(ctx context.Context, fn func() (any, error)) (any, error) {
	ch := make(chan reply, 1)
	m.in.post(msgCall{fn: fn, reply: ch})
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the job owner: %w", ctx.Err())
	}
}

// call applies one request in a transaction of its own: its answer goes
// out only once its writes are stored, and a failed commit undoes them.
func (m *Manager) call(c msgCall) {
	if err := m.readOnly(); err != nil {
		c.reply <- reply{err: err}
		return
	}
	if err := m.commit(m.pass); err != nil {
		c.reply <- reply{err: fmt.Errorf("the store refuses writes: %w", err)}
		return
	}
	outer := m.pass
	m.pass = &txn{}
	defer func() { m.pass = outer }()
	v, err := c.fn()
	if cerr := m.commit(m.pass); cerr != nil {
		m.rollback(m.pass)
		c.reply <- reply{err: fmt.Errorf("could not store the change, nothing was done: %w", cerr)}
		return
	}
	if d, ok := v.(deferred); ok && err == nil {
		m.launcher.hold(d.key, c.reply)
		return
	}
	c.reply <- reply{v: v, err: err}
}

// ---------------------------------------------------------- transactions

// txn is the writes of one step: jobs changed, events raised, and the
// commands to send once both are stored.
type txn struct {
	dirty   []*entry
	events  []*api.Event
	effects []effect
	// undo puts the owner's side tables (recoveries, validation gangs,
	// submit keys) back as they were, newest change last: a failed commit
	// runs it with the jobs' own rollback.
	undo []func()
}

func (t *txn) empty() bool { return len(t.dirty) == 0 && len(t.events) == 0 && len(t.effects) == 0 }

// save marks en changed in the current step.
func (m *Manager) save(en *entry) {
	if !slices.Contains(m.pass.dirty, en) {
		m.pass.dirty = append(m.pass.dirty, en)
	}
}

// raise adds a server event to the current step.
func (m *Manager) raise(e *api.Event) {
	if e.TimeUnixNano == 0 {
		e.TimeUnixNano = m.now().UnixNano()
	}
	if e.Severity == api.Severity_SEVERITY_UNSPECIFIED {
		e.Severity = api.Severity_SEVERITY_INFO
	}
	m.pass.events = append(m.pass.events, e)
}

// act adds a command fan-out to run once the step is committed.
func (m *Manager) act(e effect) { m.pass.effects = append(m.pass.effects, e) }

// commit writes t in one store transaction, then publishes what changed
// and sends its commands. On failure t is left as it was.
func (m *Manager) commit(t *txn) error {
	if t.empty() {
		return nil
	}
	if len(t.dirty) > 0 || len(t.events) > 0 {
		err := m.cfg.Store.Update(func(tx store.Tx) error {
			for _, en := range t.dirty {
				if err := tx.PutJob(en.job); err != nil {
					return err
				}
			}
			for _, e := range t.events {
				if err := tx.AppendEvent(e); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	for _, en := range t.dirty {
		en.committed = proto.Clone(en.job).(*api.Job)
		if m.cfg.Publish != nil {
			m.cfg.Publish.PublishJob(en.committed)
		}
	}
	if m.cfg.Publish != nil {
		for _, e := range t.events {
			m.cfg.Publish.PublishEvent(e)
		}
	}
	if len(t.dirty) > 0 {
		m.publishView()
	}
	for _, e := range t.effects {
		e(m.disp)
	}
	*t = txn{}
	return nil
}

// remember records table[key] as it is before the current step changes
// it, so that a failed commit puts it back.
func remember[K comparable, V any](t *txn, table map[K]V, key K) {
	old, had := table[key]
	t.undo = append(t.undo, func() {
		if had {
			table[key] = old
		} else {
			delete(table, key)
		}
	})
}

// rollback undoes t's changes in memory: each job goes back to what was
// last committed (a job never committed is forgotten), and the side
// tables to what they held before t.
func (m *Manager) rollback(t *txn) {
	for i := len(t.undo) - 1; i >= 0; i-- {
		t.undo[i]()
	}
	for _, en := range t.dirty {
		if en.committed == nil {
			delete(m.jobs, en.job.GetId())
			continue
		}
		en.job = proto.Clone(en.committed).(*api.Job)
	}
	*t = txn{}
}

// check verifies a transition against the lifecycle table.
func (m *Manager) check(from Phase, ev Event, j *api.Job) {
	if err := transitioned(from, ev, j); err != nil {
		if m.strict {
			panic(err)
		}
		m.log.Error("lifecycle", "err", err)
	}
}

// -------------------------------------------------------------- reading

// View is the committed jobs, oldest first, as the owner last stored
// them. It is never modified: a new one replaces it after every commit.
type View struct {
	Jobs    []*api.Job
	byID    map[string]*api.Job
	targets []StallTarget
}

func (m *Manager) publishView() {
	v := &View{byID: make(map[string]*api.Job, len(m.jobs)), targets: m.stall.targets()}
	for _, en := range m.jobs {
		if en.committed != nil {
			v.Jobs = append(v.Jobs, en.committed)
			v.byID[en.committed.GetId()] = en.committed
		}
	}
	for _, j := range m.exec.sorted() {
		v.Jobs = append(v.Jobs, j)
		v.byID[j.GetId()] = j
	}
	slices.SortFunc(v.Jobs, api.OldestFirst)
	m.view.Store(v)
}

// Find resolves an id or a name. A name matching several jobs picks the
// one still active, and is an error when that is ambiguous.
func (v *View) Find(key string) (*api.Job, error) {
	if j, ok := v.byID[key]; ok {
		return j, nil
	}
	return api.FindJob(v.Jobs, key)
}

// findEntry resolves an id or a name on the owner.
func (m *Manager) findEntry(key string) (*entry, error) {
	j, err := m.View().Find(key)
	if err != nil {
		if en, ok := m.jobs[key]; ok {
			return en, nil
		}
		return nil, err
	}
	en := m.jobs[j.GetId()]
	if en == nil {
		return nil, fmt.Errorf("unknown job %q: `gpuctl jobs` lists them", key)
	}
	return en, nil
}

// sorted returns every entry, oldest first.
func (m *Manager) sorted() []*entry {
	out := make([]*entry, 0, len(m.jobs))
	for _, en := range m.jobs {
		out = append(out, en)
	}
	slices.SortFunc(out, func(a, b *entry) int { return api.OldestFirst(a.job, b.job) })
	return out
}

// SetObserver has o hear the owner's measurements from now on.
func (m *Manager) SetObserver(o Observer) { m.obs.Store(&o) }

func (m *Manager) observer() Observer {
	if p := m.obs.Load(); p != nil {
		return *p
	}
	return nil
}

// queued is how many jobs wait for the scheduler.
func (m *Manager) queued() int {
	n := 0
	for _, en := range m.jobs {
		if en.job.GetState() == api.JobState_JOB_STATE_PENDING && !en.job.GetHold() {
			n++
		}
	}
	return n
}
