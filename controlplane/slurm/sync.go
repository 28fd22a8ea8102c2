package slurm

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// Reason prefixes that say which side took a node out, so that the two
// sides follow each other without echoing: a cordon gpuctl made from
// Slurm's state starts with SlurmReason; a drain made in Slurm from
// gpuctl's cordon with GpuctlReason.
const (
	SlurmReason  = "Slurm: "
	GpuctlReason = "gpuctl: "
)

// Registry is what the poller needs of the node registry.
type Registry interface {
	Nodes() []*api.NodeStatus
	Ranks(job string) []nodes.NodeRanks
	SetCordon(node, action, reason string) (*api.NodeStatus, error)
}

// Owner is what the poller needs of the job owner.
type Owner interface {
	List(key string) ([]*api.Job, error)
	ExecutorFailed(job string, attempt uint32, nodes []string, reason string)
	ExternalJobs(jobs []*api.Job)
	ExecutorPlaced(job string, attempt uint32, nodes []string)
}

// Poller reads Slurm's view on an interval, outside the job owner, and
// sends it in: node states to the registry (both ways), lost nodes of
// gpuctl's attempts and the jobs submitted without gpuctl to the owner.
type Poller struct {
	X        *Executor
	Registry Registry
	Owner    Owner
	// Every is the polling interval, default 1 s.
	Every time.Duration
	Log   *slog.Logger

	failed map[string]bool // job/attempt already reported failed
	// ended counts the polls that found an attempt's Slurm job gone
	// before any of its ranks was seen.
	ended map[string]int
	// details are the external jobs' scontrol show job -d, by id.
	details map[string]JobInfo
	warned  string // the last error logged, so a down slurmctld logs once
}

// Run polls until ctx ends.
func (p *Poller) Run(ctx context.Context) {
	if p.Every <= 0 {
		p.Every = time.Second
	}
	t := time.NewTicker(p.Every)
	defer t.Stop()
	for {
		p.Once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Once polls once.
func (p *Poller) Once(ctx context.Context) {
	if p.failed == nil {
		p.failed, p.ended = map[string]bool{}, map[string]int{}
	}
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cli := &p.X.cfg.CLI
	var errs []string
	var states []NodeState
	out, err := cli.Run(cctx, nil, nil, "sinfo", "-h", "-N", "-o", NodeFormat)
	if err == nil {
		states, err = ParseSinfo(out)
	}
	if err != nil {
		errs = append(errs, err.Error())
	} else {
		p.syncNodes(cctx, states)
	}
	var queue []QueueJob
	out, err = cli.Run(cctx, nil, nil, "squeue", "-h", "--states=all", "-o", QueueFormat)
	if err == nil {
		queue, err = ParseSqueue(out)
	}
	if err != nil {
		// Nothing is changed on what could not be read: the jobs listed
		// stay as they were until squeue answers again.
		errs = append(errs, err.Error())
	} else {
		p.X.learn(queue)
		p.Owner.ExternalJobs(p.externalJobs(cctx, queue))
		p.checkJobs(queue, states)
	}
	if msg := strings.Join(errs, "; "); msg != p.warned {
		if msg != "" {
			p.Log.Error("Slurm poll failed; node states and Slurm's own jobs are not refreshed until it answers", "err", msg)
		} else {
			p.Log.Info("Slurm answers again")
		}
		p.warned = msg
	}
}

// NodeAction is one step that brings gpuctl's and Slurm's node states
// together.
type NodeAction struct {
	Node string
	// Do is cordon or uncordon (gpuctl), drain or resume (Slurm).
	Do     string
	Reason string
}

// SyncNodes decides how to bring the two views of the nodes both know
// together: Slurm down or drained → gpuctl cordons (SlurmReason…); gpuctl
// cordoned → Slurm drains (GpuctlReason…); each side lifts only what it
// took from the other.
func SyncNodes(gpuctl []*api.NodeStatus, slurm []NodeState) []NodeAction {
	byName := map[string]NodeState{}
	for _, s := range slurm {
		byName[s.Name] = s
	}
	var out []NodeAction
	for _, n := range gpuctl {
		name := n.GetRegistration().GetName()
		s, ok := byName[name]
		if !ok {
			continue
		}
		reason := n.GetCordonReason()
		fromSlurm := strings.HasPrefix(reason, SlurmReason)
		fromGpuctl := strings.HasPrefix(s.Reason, GpuctlReason)
		switch {
		case n.GetCordoned() && !fromSlurm && !s.Drained():
			// gpuctl took it out (an operator, a recovery): Slurm drains it
			// with gpuctl's reason, down or not.
			out = append(out, NodeAction{Node: name, Do: "drain", Reason: GpuctlReason + orNone(reason)})
		case n.GetCordoned() && fromSlurm && !s.Unavailable():
			out = append(out, NodeAction{Node: name, Do: nodes.ActionUncordon})
		case n.GetCordoned() && fromSlurm && s.State == "down" && !fromGpuctl:
			// A node Slurm lost stays out once its slurmd is back
			// (ReturnToService), as a gpuctl cordon outlives an outage,
			// until someone lifts it on either side.
			out = append(out, NodeAction{Node: name, Do: "drain", Reason: GpuctlReason + reason})
		case !n.GetCordoned() && s.Unavailable() && fromGpuctl && s.Drained():
			out = append(out, NodeAction{Node: name, Do: "resume"})
		case !n.GetCordoned() && s.Unavailable() && !fromGpuctl:
			out = append(out, NodeAction{Node: name, Do: nodes.ActionCordon, Reason: slurmWhy(s)})
		}
	}
	return out
}

func slurmWhy(s NodeState) string {
	why := SlurmReason + s.Name + " is " + s.State
	if s.NotResponding && s.State != "down" {
		why += ", not responding"
	}
	if s.Reason != "" {
		// Free text from Slurm's operators, shown in the console.
		why += " (" + api.CleanText(s.Reason, 0) + ")"
	}
	return why
}

func orNone(s string) string {
	if s == "" {
		return "cordoned"
	}
	return s
}

func (p *Poller) syncNodes(ctx context.Context, states []NodeState) {
	for _, a := range SyncNodes(p.Registry.Nodes(), states) {
		var err error
		switch a.Do {
		case nodes.ActionCordon, nodes.ActionUncordon:
			_, err = p.Registry.SetCordon(a.Node, a.Do, a.Reason)
		case "drain":
			_, err = p.X.cfg.CLI.Run(ctx, nil, nil, "scontrol", "update", "nodename="+a.Node, "state=drain", "reason="+a.Reason)
		case "resume":
			_, err = p.X.cfg.CLI.Run(ctx, nil, nil, "scontrol", "update", "nodename="+a.Node, "state=resume")
		}
		if err != nil {
			p.Log.Error("sync node state with Slurm", "node", a.Node, "action", a.Do, "err", err)
			continue
		}
		p.Log.Info("node state synced with Slurm", "node", a.Node, "action", a.Do, "reason", a.Reason)
	}
}

// checkJobs reports gpuctl's running attempts that lost a node in Slurm
// (down, failed: not a drain, which lets jobs finish).
func (p *Poller) checkJobs(queue []QueueJob, states []NodeState) {
	lost := map[string]NodeState{}
	for _, s := range states {
		if s.Unavailable() && !s.Drained() {
			lost[s.Name] = s
		}
	}
	all, err := p.Owner.List("")
	if err != nil {
		return
	}
	for _, j := range all {
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStopping() != api.JobStop_JOB_STOP_NONE || strings.HasPrefix(j.GetId(), "slurm-") {
			continue
		}
		key := fmt.Sprintf("%s/%d", j.GetId(), j.GetAttempt())
		if p.failed[key] {
			continue
		}
		if p.endedEarly(j, key, queue) {
			continue
		}
		p.readPlacement(j, queue)
		var gone []string
		var why []string
		for _, jn := range j.GetPlacement() {
			if s, ok := lost[jn.GetNode()]; ok {
				gone = append(gone, jn.GetNode())
				why = append(why, slurmWhy(s))
			}
		}
		if len(gone) == 0 {
			continue
		}
		p.failed[key] = true
		p.Log.Warn("Slurm lost nodes of a running attempt", "job", j.GetId(), "attempt", j.GetAttempt(), "nodes", gone)
		p.Owner.ExecutorFailed(j.GetId(), j.GetAttempt(), gone, strings.Join(why, "; "))
	}
}

// endedEarly reports (once) an attempt whose Slurm job ended before any of
// its ranks was seen: the batch script failed (a missing output dir, a task
// command not on the nodes), and no rank will ever report.
func (p *Poller) endedEarly(j *api.Job, key string, queue []QueueJob) bool {
	id := p.X.SlurmID(j.GetId(), j.GetAttempt())
	if id == "" {
		return false
	}
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if r.GetPid() != 0 || r.GetExited() {
				return false
			}
		}
	}
	state := "gone from squeue"
	for _, q := range queue {
		if q.ID == id {
			if !SlurmEnded(q.State) {
				delete(p.ended, key)
				return false
			}
			state = q.State
		}
	}
	// Three polls: nodemon finds a rank within its own poll, so a miss may
	// be a rank not found yet.
	if p.ended[key]++; p.ended[key] < 3 {
		return false
	}
	if state == "gone from squeue" {
		// Where accounting is configured, sacct knows how it ended; it is
		// optional, so without it the reason says less.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		out, err := p.X.cfg.CLI.Run(ctx, nil, nil, "sacct", "-P", "-n", "-j", id, "-o", "JobID,State,ExitCode,NodeList")
		cancel()
		if steps, perr := ParseSacct(out); err == nil && perr == nil {
			for _, st := range steps {
				if st.JobID == id {
					state = st.State + ", exit " + st.ExitCode
				}
			}
		}
	}
	p.failed[key] = true
	why := fmt.Sprintf("Slurm job %s ended (%s) before any rank started: its output, %s/slurm-%s.out on its first node, says why", id, state, p.X.cfg.RunDir, id)
	p.Log.Warn("Slurm job ended before its ranks started", "job", j.GetId(), "attempt", j.GetAttempt(), "slurm_job", id, "state", state)
	p.Owner.ExecutorFailed(j.GetId(), j.GetAttempt(), nil, why)
	return true
}

// readPlacement tells the owner where Slurm ran an attempt it placed
// (--slurm-placement slurm): squeue's node list, expanded, is the tasks'
// SLURM_NODEID order, which is the rank order the tasks took.
func (p *Poller) readPlacement(j *api.Job, queue []QueueJob) {
	if p.X.cfg.Placement != PlaceSlurm {
		return
	}
	id := p.X.SlurmID(j.GetId(), j.GetAttempt())
	for _, q := range queue {
		if q.ID != id || id == "" || q.State != "RUNNING" || len(q.Nodes) != len(j.GetPlacement()) {
			continue
		}
		same := true
		for i, jn := range j.GetPlacement() {
			same = same && jn.GetNode() == q.Nodes[i]
		}
		if !same {
			p.Log.Info("Slurm placed an attempt", "job", j.GetId(), "attempt", j.GetAttempt(), "nodes", q.Nodes)
			p.Owner.ExecutorPlaced(j.GetId(), j.GetAttempt(), q.Nodes)
		}
	}
}

// SlurmEnded reports whether a Slurm job state is final.
func SlurmEnded(state string) bool {
	switch state {
	case "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD":
		return false
	}
	return true
}

// externalJobs lists the Slurm jobs gpuctl did not submit, with the ranks
// nodemon reports of them and, from scontrol show job -d, their user,
// restarts and the GPUs Slurm gave them on each node (read once per job
// once it runs).
func (p *Poller) externalJobs(ctx context.Context, queue []QueueJob) []*api.Job {
	if p.details == nil {
		p.details = map[string]JobInfo{}
	}
	var out []*api.Job
	seen := map[string]bool{}
	missing := false
	for _, q := range queue {
		if _, _, ok := ParseComment(q.Comment); ok {
			continue
		}
		seen[q.ID] = true
		if _, ok := p.details[q.ID]; !ok && q.State == "RUNNING" {
			missing = true
		}
	}
	if missing {
		if out, err := p.X.cfg.CLI.Run(ctx, nil, nil, "scontrol", "show", "job", "-d"); err == nil {
			if infos, err := ParseScontrolJobs(out); err == nil {
				for _, in := range infos {
					if id := in.Get("JobId"); seen[id] && in.Get("JobState") == "RUNNING" {
						p.details[id] = in
					}
				}
			} else {
				p.Log.Warn("read scontrol show job -d", "err", err)
			}
		}
	}
	for id := range p.details {
		if !seen[id] {
			delete(p.details, id)
		}
	}
	for _, q := range queue {
		if _, _, ok := ParseComment(q.Comment); ok {
			continue
		}
		var info *JobInfo
		if in, ok := p.details[q.ID]; ok {
			info = &in
		}
		out = append(out, ExternalJob(q, p.Registry.Ranks(api.SlurmJobName(q.ID)), info))
	}
	return out
}

// GRESGPUs reads the GPU indexes of a -d detail's GRES (gpu:2(IDX:0-1),
// gpu:a100:2(IDX:0,3)).
func GRESGPUs(gres string) []uint32 {
	var out []uint32
	for _, part := range splitGRES(gres) {
		if !strings.HasPrefix(part, "gpu") {
			continue
		}
		_, idx, ok := strings.Cut(part, "(IDX:")
		if !ok {
			continue
		}
		idx, _, _ = strings.Cut(idx, ")")
		for _, r := range strings.Split(idx, ",") {
			lo, hi, isRange := strings.Cut(r, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a < 0 || b < a || b-a > 1024 {
				continue
			}
			for n := a; n <= b; n++ {
				out = append(out, uint32(n))
			}
		}
	}
	return out
}

// splitGRES splits a GRES list at commas outside parentheses.
func splitGRES(s string) []string { return splitOutside(s, '(', ')') }

// ExternalJob is how gpuctl lists a Slurm job it did not submit; info (may
// be nil) is its scontrol show job -d.
func ExternalJob(q QueueJob, ranks []nodes.NodeRanks, info *JobInfo) *api.Job {
	j := &api.Job{Id: api.SlurmJobName(q.ID), Name: q.Name, Attempt: 1,
		Reason: fmt.Sprintf("Slurm job %s (%s), submitted without gpuctl: listed and traced, not scheduled or recovered by gpuctl", q.ID, q.State)}
	switch q.State {
	case "PENDING", "CONFIGURING":
		j.State, j.PendingReason = api.JobState_JOB_STATE_PENDING, "Slurm: "+q.Reason
	case "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED":
		j.State = api.JobState_JOB_STATE_RUNNING
	case "COMPLETED":
		j.State = api.JobState_JOB_STATE_SUCCEEDED
	case "CANCELLED":
		j.State = api.JobState_JOB_STATE_CANCELLED
	default:
		j.State = api.JobState_JOB_STATE_FAILED
	}
	byNode := map[string][]*api.RankStatus{}
	for _, nr := range ranks {
		byNode[nr.Node] = nr.Ranks
	}
	step := int64(-1)
	for _, n := range q.Nodes {
		jn := &api.JobNode{Node: n}
		rs := slices.Clone(byNode[n])
		slices.SortFunc(rs, func(a, b *api.RankStatus) int { return int(a.GetRank() - b.GetRank()) })
		for i, r := range rs {
			jn.Ranks = append(jn.Ranks, &api.JobRank{Rank: r.GetRank(), LocalRank: int32(i), Pid: r.GetPid()})
			step = max(step, r.GetStep())
		}
		j.Placement = append(j.Placement, jn)
	}
	if step >= 0 {
		j.Step = step
	}
	if info != nil {
		if user, _, _ := strings.Cut(info.Get("UserId"), "("); user != "" {
			j.Reason += "; user " + user
		}
		if n, err := strconv.Atoi(info.Get("Restarts")); err == nil {
			j.Attempt = uint32(n + 1)
		}
		// The GPUs Slurm allocated: gpuctl's scheduler counts them busy.
		for _, d := range info.Details {
			hosts, _ := ExpandHostlist(d["Nodes"])
			gpus := GRESGPUs(d["GRES"])
			for _, jn := range j.Placement {
				if slices.Contains(hosts, jn.GetNode()) {
					jn.Gpus = gpus
				}
			}
		}
	}
	return j
}
