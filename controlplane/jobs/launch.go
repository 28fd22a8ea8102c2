package jobs

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
	"github.com/gpuctl/gpuctl/scheduler"
	"github.com/gpuctl/gpuctl/scheduler/fencing"
)

// launcher starts and signals attempts for the owner: it queues each
// launch and signal to run once its step is committed, applies the nodes'
// answers to a launch, and holds the replies waiting for one. The jobs and
// the current step are the owner's, reached through m. It runs on the
// owner's goroutine only.
type launcher struct {
	m *Manager
	// waiting are replies held until a launch they depend on answers.
	waiting map[launchKey][]chan reply
}

// hold keeps ch until the launch key answers.
func (ln *launcher) hold(key launchKey, ch chan reply) {
	ln.waiting[key] = append(ln.waiting[key], ch)
}

// signal sends sig to the job's ranks on every node that still has live
// ones, once the step is committed. Failures are logged: the stop timers
// send again.
func (ln *launcher) signal(j *api.Job, sig string) {
	id := j.GetId()
	var nodes []string
	for _, jn := range j.GetPlacement() {
		for _, r := range jn.GetRanks() {
			if !r.GetExited() {
				nodes = append(nodes, jn.GetNode())
				break
			}
		}
	}
	// For this attempt only: a late stop must not reach a successor.
	ln.signalAttempt(id, j.GetAttempt(), nodes, sig)
}

// signalNodes sends sig to the ranks of every attempt of job id on nodes.
func (ln *launcher) signalNodes(id string, nodes []string, sig string) {
	ln.signalAttempt(id, 0, nodes, sig)
}

// signalAttempt sends sig to the ranks of one attempt of job id (every
// attempt when 0) on nodes.
func (ln *launcher) signalAttempt(id string, attempt uint32, nodes []string, sig string) {
	if len(nodes) == 0 {
		return
	}
	log, timeout := ln.m.log, ln.m.cfg.SignalTimeout
	ln.m.act(func(d *dispatcher) {
		d.signalOn(id, attempt, nodes, sig, timeout, func(errs map[string]error) {
			for node, err := range errs {
				log.Warn("signal ranks", "job", id, "node", node, "signal", sig, "err", err)
			}
			log.Info("signalled ranks", "job", id, "signal", sig, "nodes", nodes)
		})
	})
}

// launch queues the current attempt's launch on every node of it; a node
// that refuses comes back as msgLaunched.
func (ln *launcher) launch(en *entry) {
	j := en.job
	user, group := ln.m.cfg.RunAs.RunAs(en.spec)
	launches := map[string]*api.LaunchRanks{}
	var nodes []string
	addrs := ln.m.fence.witnessAddrs()
	for i, jn := range j.GetPlacement() {
		l := &api.LaunchRanks{Job: j.GetId(), Attempt: j.GetAttempt(), Command: en.spec.Command, Env: en.spec.Env,
			WorldSize: int32(jobGPUs(j)), MasterAddr: j.GetMasterAddr(), MasterPort: j.GetMasterPort(),
			CheckpointDir: j.GetCheckpointDir(), ResumeStep: j.GetResumeStep(),
			NodeRank: int32(i), NumNodes: int32(len(j.GetPlacement())), RunAsUser: user, RunAsGroup: group}
		for _, r := range jn.GetRanks() {
			l.Ranks = append(l.Ranks, &api.RankSpec{Rank: r.GetRank(), LocalRank: r.GetLocalRank(), Gpus: []uint32{r.GetGpu()}})
		}
		// Every witness is named, even one with no address now: the node's
		// quorum must be counted over the same set the server fences by.
		for _, w := range fencing.Of(j.GetWitnesses(), jn.GetNode()) {
			l.Witnesses = append(l.Witnesses, &api.Witness{Name: w, Addr: addrs[w]})
		}
		launches[jn.GetNode()] = l
		nodes = append(nodes, jn.GetNode())
	}
	id, attempt, exclude := j.GetId(), j.GetAttempt(), slices.Clone(j.GetExclude())
	ln.m.log.Info("job starting", "job", id, "attempt", attempt, "nodes", nodes, "master", fmt.Sprintf("%s:%d", j.GetMasterAddr(), j.GetMasterPort()))
	timeout, post := ln.m.cfg.CommandTimeout, ln.m.in.post
	ln.m.act(func(d *dispatcher) {
		d.launchOn(AttemptLaunch{Job: id, Attempt: attempt, Nodes: nodes, Ranks: launches, Exclude: exclude}, timeout, func(errs map[string]error) {
			post(msgLaunched{job: id, attempt: attempt, errs: errs})
		})
	})
}

// launched applies the nodes' answers to a launch: a node that refused
// fails the attempt (its ranks there never started; the others stop).
func (ln *launcher) launched(msg msgLaunched) {
	defer ln.answer(launchKey{msg.job, msg.attempt})
	en := ln.m.jobs[msg.job]
	if len(msg.errs) == 0 {
		if en != nil {
			en.retries = 0
		}
		return
	}
	if en == nil || en.job.GetAttempt() != msg.attempt {
		return
	}
	j := en.job
	// Nodes refused only because another node was (an executor starts
	// the attempt whole) are not to blame.
	blamed := map[string]error{}
	for node, err := range msg.errs {
		if !errors.Is(err, ErrNotStarted) {
			blamed[node] = err
		}
	}
	if len(blamed) == 0 {
		blamed = msg.errs
	}
	var msgs []string
	for _, jn := range j.GetPlacement() {
		err, ok := msg.errs[jn.GetNode()]
		if !ok {
			continue
		}
		if _, ok := blamed[jn.GetNode()]; ok {
			msgs = append(msgs, fmt.Sprintf("%s: %v", jn.GetNode(), err))
		}
		for _, r := range jn.GetRanks() {
			if !r.GetExited() && r.GetPid() == 0 {
				r.Exited, r.ExitCode, r.Signal = true, -1, "not launched"
			}
		}
	}
	ln.m.save(en)
	if active(j) {
		refused := slices.Sorted(mapKeys(blamed))
		why := "launch failed on " + strings.Join(msgs, "; ")
		if executorUnavailable(blamed) {
			ln.m.exec.requeue(en, blamed[refused[0]].Error(), ln.m.now())
			ln.m.kick()
			return
		}
		if jobFaults(blamed) {
			// The job's own fault (a typo in its command, a user the node
			// lacks): no node is to blame, and a restart would fail the
			// same way.
			ln.m.rec.giveUp(en, why, ln.m.now())
		} else {
			ln.refusedLaunch(en, blamed, why)
		}
	}
	ln.m.kick()
}

// refusedLaunch fails a job over the nodes that did not start its ranks.
// A node that refused by a policy of its own (CommandError.NodeRefused)
// is excluded for this job and flagged with an event, never cordoned: it
// serves other jobs. The other nodes are suspected as a lost node is.
func (ln *launcher) refusedLaunch(en *entry, blamed map[string]error, why string) {
	j := en.job
	var policy, broken []string
	for _, node := range slices.Sorted(mapKeys(blamed)) {
		var ce *nodes.CommandError
		if errors.As(blamed[node], &ce) && ce.NodeRefused {
			policy = append(policy, node)
			ln.m.raise(&api.Event{Kind: api.EventKind_EVENT_KIND_RECOVERY, Severity: api.Severity_SEVERITY_WARNING, Node: node, Job: j.GetId(),
				Message: fmt.Sprintf("%s refused job %s by its own policy (%s); the job runs without it, and the node stays open to other jobs",
					node, j.GetId(), ce.Msg)})
		} else {
			broken = append(broken, node)
		}
	}
	now := ln.m.now()
	if len(broken) > 0 {
		ln.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailNodeDown, Nodes: broken}, why, now)
	}
	if len(policy) > 0 && (active(j) || phaseOf(j) == Recovering) {
		ln.m.rec.fail(en, scheduler.Failure{Kind: scheduler.FailRefused, Nodes: policy}, why, now)
	}
}

// jobFaults reports whether every refusal in errs is the job's fault.
func jobFaults(errs map[string]error) bool {
	for _, err := range errs {
		var ce *nodes.CommandError
		if !errors.As(err, &ce) || !ce.JobFault {
			return false
		}
	}
	return len(errs) > 0
}

// port picks the attempt's MASTER_PORT: a hash of job and attempt into
// the configured range, stepping past ports of jobs still holding ranks,
// so a relaunch never meets its predecessor's listener. Each job gets a
// pair, MASTER_PORT and MASTER_PORT+1, since trainers (ringtrain among
// them) meet on a second communicator at the next port.
func (ln *launcher) port(id string, attempt uint32) uint32 {
	used := map[int]bool{}
	for _, en := range ln.m.jobs {
		if en.job.GetId() != id && liveRanks(en.job) > 0 {
			used[int(en.job.GetMasterPort())] = true
		}
	}
	for _, v := range ln.m.gangs.byID {
		used[int(v.port)] = true
	}
	pairs := max(ln.m.cfg.PortRange/2, 1)
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	off := int(h.Sum32() % uint32(pairs))
	for i := range pairs {
		p := ln.m.cfg.PortBase + 2*((off+i)%pairs)
		if !used[p] {
			return uint32(p)
		}
	}
	return uint32(ln.m.cfg.PortBase + 2*off)
}

// addrOf is the address ranks dial for node: the host its nodemon
// connects from, else its hostname, else its name.
func (ln *launcher) addrOf(node string) string {
	for _, n := range ln.m.cfg.Nodes.Nodes() {
		if n.GetRegistration().GetName() != node {
			continue
		}
		if host, _, err := net.SplitHostPort(n.GetRemoteAddr()); err == nil && host != "" {
			return host
		}
		if h := n.GetRegistration().GetHostname(); h != "" {
			return h
		}
	}
	return node
}

// answer releases the replies waiting on a launch: the job as it stands,
// or the launch's failure.
func (ln *launcher) answer(key launchKey) {
	chans := ln.waiting[key]
	if len(chans) == 0 {
		return
	}
	delete(ln.waiting, key)
	var r reply
	if en := ln.m.jobs[key.job]; en != nil {
		out := proto.Clone(en.job).(*api.Job)
		r.v = out
		if out.GetState() == api.JobState_JOB_STATE_FAILED || out.GetAttempt() != key.attempt {
			r.err = fmt.Errorf("job %s: %s", out.GetId(), out.GetReason())
		}
	} else {
		r.err = fmt.Errorf("job %s is gone", key.job)
	}
	for _, ch := range chans {
		ch <- r
	}
}

func (ln *launcher) failWaiting(why string) {
	for key, chans := range ln.waiting {
		for _, ch := range chans {
			ch <- reply{err: errors.New(why)}
		}
		delete(ln.waiting, key)
	}
}
