package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	batchlisters "k8s.io/client-go/listers/batch/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// Config configures the Kubernetes executor.
type Config struct {
	Client kubernetes.Interface
	Spec   Spec
	// Usable says whether gpuctl still lets a node take ranks (not
	// cordoned, not lost); nil: every node gpuctl placed on. A placed
	// node must also be a Ready, schedulable Kubernetes Node.
	Usable func(node string) bool
	// StopGrace is the pods' grace period at a SIGTERM; default 30 s.
	StopGrace time.Duration
	// Registry, when set, follows the Nodes' states and they its
	// cordons (SyncNodes), on every Node event and every SyncEvery
	// (default 1 s) for gpuctl's side.
	Registry  Registry
	SyncEvery time.Duration
	// Owner, when set, hears of the pods gpuctl did not create that hold
	// GPUs (ForeignJobs), whenever that list changes, and of the running
	// attempts Kubernetes lost (LostAttempts): a placed Node NotReady or
	// gone, or the attempt's Job failed before any rank started.
	Owner Owner
	Log   *slog.Logger
}

// Registry is what the node sync needs of gpuctl's node registry.
type Registry interface {
	Nodes() []*api.NodeStatus
	SetCordon(node, action, reason string) (*api.NodeStatus, error)
	SetLabels(node string, labels map[string]string, source string) (*api.NodeStatus, error)
}

// Owner is what the executor reads of the job owner and tells it
// (jobs.Front: it only queues, so the executor is built before the
// owner).
type Owner interface {
	View() *jobs.View
	ExternalJobs(jobs []*api.Job)
	ExecutorFailed(job string, attempt uint32, nodes []string, reason string)
}

// Executor runs attempts as Kubernetes objects and binds their pods. One
// goroutine (Run) owns the gangs waiting to be bound: the informers' events
// and Launch reach it as messages, as the job owner's inbox does.
type Executor struct {
	cfg   Config
	log   *slog.Logger
	inbox chan func()
	// Owned by Run's goroutine.
	gangs map[string]*gang
	pods  corelisters.PodLister
	nodes corelisters.NodeLister
	// foreign is the last list of foreign GPU pods told to the owner.
	foreign []*api.Job
	// lost are the attempts already told to the owner as lost, and
	// unstarted how many checks in a row an attempt's Job has been failed
	// with no rank reported.
	lost      map[string]bool
	unstarted map[string]int
	jobs      batchlisters.JobLister
	// ready closes once the watches have synced, stopped when Run returns.
	ready, stopped chan struct{}
}

// gang is one attempt waiting for its pods to be bound.
type gang struct {
	job       string
	attempt   uint32
	placement []string
	done      chan error
	wait      string
}

// New returns the executor; Run must run for Launch to return.
func New(cfg Config) *Executor {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = 30 * time.Second
	}
	if cfg.SyncEvery == 0 {
		cfg.SyncEvery = time.Second
	}
	if cfg.Spec.Namespace == "" {
		cfg.Spec.Namespace = "default"
	}
	return &Executor{cfg: cfg, log: cfg.Log, inbox: make(chan func(), 64), gangs: map[string]*gang{},
		lost: map[string]bool{}, unstarted: map[string]int{}, ready: make(chan struct{}), stopped: make(chan struct{})}
}

// Run watches the attempts' pods and the Nodes, and binds gangs, until
// ctx ends.
func (x *Executor) Run(ctx context.Context) error {
	defer close(x.stopped)
	// Every namespace's pods: gpuctl's attempts' in its own, and any
	// other pod that holds GPUs.
	inf := informers.NewSharedInformerFactory(x.cfg.Client, 0)
	pods, nodes := inf.Core().V1().Pods(), inf.Core().V1().Nodes()
	x.pods, x.nodes = pods.Lister(), nodes.Lister()
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			if tomb, isTomb := obj.(cache.DeletedFinalStateUnknown); isTomb {
				p, ok = tomb.Obj.(*corev1.Pod)
			}
		}
		if !ok {
			return
		}
		if p.Namespace == x.cfg.Spec.Namespace && p.Labels[LabelManaged] == "gpuctl" {
			key := gangKey(p.Labels[LabelJob], p.Labels[LabelAttempt])
			x.send(ctx, func() { x.decide(ctx, key) })
			return
		}
		x.send(ctx, x.reportForeign)
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onPod, UpdateFunc: func(_, obj any) { onPod(obj) }, DeleteFunc: onPod,
	}); err != nil {
		return err
	}
	onNode := func(any) { x.send(ctx, func() { x.decideAll(ctx); x.syncNodes(ctx); x.checkAttempts() }) }
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onNode, UpdateFunc: func(_, obj any) { onNode(obj) }, DeleteFunc: onNode,
	}); err != nil {
		return err
	}
	// The attempts' Jobs, in gpuctl's namespace only.
	nsInf := informers.NewSharedInformerFactoryWithOptions(x.cfg.Client, 0, informers.WithNamespace(x.cfg.Spec.Namespace))
	batch := nsInf.Batch().V1().Jobs()
	x.jobs = batch.Lister()
	onJob := func(any) { x.send(ctx, x.checkAttempts) }
	if _, err := batch.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: onJob, UpdateFunc: func(_, obj any) { onJob(obj) }, DeleteFunc: onJob,
	}); err != nil {
		return err
	}
	inf.Start(ctx.Done())
	nsInf.Start(ctx.Done())
	for _, synced := range []cache.InformerSynced{pods.Informer().HasSynced, nodes.Informer().HasSynced, batch.Informer().HasSynced} {
		if !cache.WaitForCacheSync(ctx.Done(), synced) {
			return fmt.Errorf("kubernetes: the pod and node watches did not sync: %w", ctx.Err())
		}
	}
	close(x.ready)
	x.reportForeign()
	tick := time.NewTicker(x.cfg.SyncEvery)
	defer tick.Stop()
	for {
		select {
		case f := <-x.inbox:
			f()
		case <-tick.C:
			x.syncNodes(ctx)
			x.checkAttempts()
		case <-ctx.Done():
			for key, g := range x.gangs {
				g.done <- fmt.Errorf("kubernetes: the executor stopped before the pods were bound (%s)", g.wait)
				delete(x.gangs, key)
			}
			return nil
		}
	}
}

// send runs f on Run's goroutine; false when it will not run.
func (x *Executor) send(ctx context.Context, f func()) bool {
	select {
	case x.inbox <- f:
		return true
	case <-ctx.Done():
	case <-x.stopped:
	}
	return false
}

func gangKey(job, attempt string) string { return job + "/" + attempt }

// Launch creates the attempt's Service and Job and returns once every pod
// is bound to its placed node; if that cannot happen (a placed node gone,
// a pod elsewhere, a binding refused, ctx's deadline) it deletes what it
// made and says why for every node.
func (x *Executor) Launch(ctx context.Context, a jobs.AttemptLaunch) map[string]error {
	fail := func(err error) map[string]error {
		out := make(map[string]error, len(a.Nodes))
		for _, n := range a.Nodes {
			out[n] = err
		}
		return out
	}
	select {
	case <-x.ready:
	case <-ctx.Done():
		return fail(fmt.Errorf("kubernetes: the pod and node watches have not synced (%w): %w", ctx.Err(), jobs.ErrExecutorUnavailable))
	}
	svc, job, err := Objects(a, x.cfg.Spec)
	if err != nil {
		return fail(err)
	}
	if err := x.fenceOlder(ctx, a.Job, a.Attempt); err != nil {
		return fail(err)
	}
	ns := x.cfg.Spec.Namespace
	if _, err := x.cfg.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fail(fmt.Errorf("kubernetes: create Service %s/%s: %w", ns, svc.Name, unreachable(err)))
	}
	if _, err := x.cfg.Client.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		x.remove(context.WithoutCancel(ctx), a.Job, a.Attempt, 0)
		return fail(fmt.Errorf("kubernetes: create Job %s/%s: %w", ns, job.Name, unreachable(err)))
	}
	g := &gang{job: a.Job, attempt: a.Attempt, placement: a.Nodes, done: make(chan error, 1), wait: "no pod seen yet"}
	key := gangKey(labelValue(a.Job), strconv.FormatUint(uint64(a.Attempt), 10))
	if !x.send(ctx, func() { x.gangs[key] = g; x.decide(ctx, key) }) {
		x.remove(context.WithoutCancel(ctx), a.Job, a.Attempt, 0)
		return fail(fmt.Errorf("kubernetes: the executor stopped"))
	}
	select {
	case err := <-g.done:
		if err != nil {
			return fail(err)
		}
		x.log.Info("attempt bound", "job", a.Job, "attempt", a.Attempt, "nodes", a.Nodes)
		return nil
	case <-ctx.Done():
		why := make(chan string, 1)
		reason := "the executor stopped"
		if x.send(context.WithoutCancel(ctx), func() {
			if g, ok := x.gangs[key]; ok {
				delete(x.gangs, key)
				why <- g.wait
				return
			}
			why <- "bound as the deadline came"
		}) {
			reason = <-why
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		x.remove(rctx, a.Job, a.Attempt, 0)
		return fail(fmt.Errorf("kubernetes: attempt %d not bound in time (%s): deleted", a.Attempt, reason))
	}
}

// fenceOlder makes sure no pod of an earlier attempt of job may still run
// a rank: those that may are deleted at once, and the launch waits (as an
// unavailable executor's does) until they are gone.
func (x *Executor) fenceOlder(ctx context.Context, job string, attempt uint32) error {
	list, err := x.pods.Pods(x.cfg.Spec.Namespace).List(labels.SelectorFromSet(map[string]string{LabelJob: labelValue(job), LabelManaged: "gpuctl"}))
	if err != nil {
		return err
	}
	var old []OldPod
	for _, p := range list {
		n, err := strconv.ParseUint(p.Labels[LabelAttempt], 10, 32)
		if err != nil || uint32(n) == attempt {
			continue
		}
		old = append(old, OldPod{Name: p.Name, Attempt: uint32(n), Node: p.Spec.NodeName, NodeReady: x.nodeReady(p.Spec.NodeName),
			Ended: p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed})
	}
	running := StillRunning(old)
	if len(running) == 0 {
		return nil
	}
	attempts := map[uint32]bool{}
	var where []string
	for _, p := range running {
		attempts[p.Attempt] = true
		where = append(where, fmt.Sprintf("%s on %s", p.Name, p.Node))
	}
	for k := range attempts {
		if err := x.remove(ctx, job, k, 0); err != nil {
			x.log.Error("delete an earlier attempt's pods", "job", job, "attempt", k, "err", err)
		}
	}
	return fmt.Errorf("kubernetes: pods of an earlier attempt may still run ranks (%s): deleted, and attempt %d waits until they are gone (%w)",
		strings.Join(where, ", "), attempt, jobs.ErrExecutorUnavailable)
}

// decide binds what DecideGang says for one gang (on Run's goroutine).
func (x *Executor) decide(ctx context.Context, key string) {
	g, ok := x.gangs[key]
	if !ok {
		return
	}
	sel := labels.SelectorFromSet(AttemptLabels(g.job, g.attempt))
	list, err := x.pods.Pods(x.cfg.Spec.Namespace).List(sel)
	if err != nil {
		g.wait = err.Error()
		return
	}
	pods := make([]GangPod, 0, len(list))
	for _, p := range list {
		idx, err := strconv.Atoi(p.Annotations[batchv1.JobCompletionIndexAnnotation])
		if err != nil {
			continue // not an indexed pod of ours
		}
		pods = append(pods, GangPod{Name: p.Name, Rank: idx, Node: p.Spec.NodeName, Deleting: p.DeletionTimestamp != nil})
	}
	d := DecideGang(g.placement, pods, x.usable)
	g.wait = d.Wait
	if d.Undo != "" {
		err := fmt.Errorf("kubernetes: attempt %d undone: %s", g.attempt, d.Undo)
		if why := x.keptOff(d.Unusable); why != "" {
			// Nodes Kubernetes has but keeps pods off for now (NotReady
			// while their kubelets catch up after an API server outage,
			// cordoned, tainted): not the nodes' failure, so the attempt
			// goes back to the queue, and the node sync cordons them in
			// gpuctl if it lasts.
			err = fmt.Errorf("%w: %s (%w)", err, why, jobs.ErrExecutorUnavailable)
		}
		x.finish(ctx, key, g, err)
		return
	}
	for _, b := range d.Bind {
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := x.cfg.Client.CoreV1().Pods(x.cfg.Spec.Namespace).Bind(bctx, &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: b.Pod, Namespace: x.cfg.Spec.Namespace},
			Target:     corev1.ObjectReference{Kind: "Node", Name: b.Node},
		}, metav1.CreateOptions{})
		cancel()
		if err != nil {
			x.finish(ctx, key, g, fmt.Errorf("kubernetes: bind pod %s to %s: %w (attempt %d undone)", b.Pod, b.Node, err, g.attempt))
			return
		}
	}
	if d.Wait == "" {
		delete(x.gangs, key)
		g.done <- nil
	}
}

// finish ends a gang that cannot be bound: its objects go.
func (x *Executor) finish(ctx context.Context, key string, g *gang, err error) {
	delete(x.gangs, key)
	x.log.Warn("attempt not bound", "job", g.job, "attempt", g.attempt, "err", err)
	x.remove(ctx, g.job, g.attempt, 0)
	g.done <- err
}

func (x *Executor) decideAll(ctx context.Context) {
	for key := range x.gangs {
		x.decide(ctx, key)
	}
}

// reportForeign tells the owner the foreign GPU pods when they changed
// (on Run's goroutine).
func (x *Executor) reportForeign() {
	if x.cfg.Owner == nil {
		return
	}
	all, err := x.pods.List(labels.Everything())
	if err != nil {
		return
	}
	resource := x.cfg.Spec.GPUResource
	if resource == "" {
		resource = GPUResource
	}
	next := ForeignJobs(all, resource)
	if slices.EqualFunc(next, x.foreign, func(a, b *api.Job) bool { return proto.Equal(a, b) }) {
		return
	}
	x.foreign = next
	x.cfg.Owner.ExternalJobs(next)
}

// syncNodes brings gpuctl's and the Nodes' states together (on Run's
// goroutine).
func (x *Executor) syncNodes(ctx context.Context) {
	if x.cfg.Registry == nil {
		return
	}
	views, err := x.nodeViews()
	if err != nil {
		return
	}
	for _, a := range SyncNodes(x.cfg.Registry.Nodes(), views) {
		var err error
		switch a.Do {
		case nodes.ActionCordon, nodes.ActionUncordon:
			_, err = x.cfg.Registry.SetCordon(a.Node, a.Do, a.Reason)
		case ActionCordonNode, ActionUncordonNode:
			err = x.cordonNode(ctx, a.Node, a.Do == ActionCordonNode, a.Reason)
		case ActionLabels:
			_, err = x.cfg.Registry.SetLabels(a.Node, a.Labels, "its Kubernetes Node's "+TopologyLabel+" labels")
		}
		if err != nil {
			x.log.Error("sync node state with Kubernetes", "node", a.Node, "action", a.Do, "err", err)
			continue
		}
		x.log.Info("node state synced with Kubernetes", "node", a.Node, "action", a.Do, "reason", a.Reason)
	}
}

// nodeViews reads every Node the watch holds.
func (x *Executor) nodeViews() ([]NodeView, error) {
	list, err := x.nodes.List(labels.Everything())
	if err != nil {
		return nil, err
	}
	views := make([]NodeView, len(list))
	for i, n := range list {
		views[i] = ViewOf(n, x.cfg.Spec.GPUResource)
	}
	return views, nil
}

// cordonNode sets a Node's unschedulable and gpuctl's reason, or lifts
// both.
func (x *Executor) cordonNode(ctx context.Context, node string, cordon bool, reason string) error {
	var reasonJSON any // null removes the annotation
	if cordon {
		reasonJSON = reason
	}
	patch, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{CordonAnnotation: reasonJSON}},
		"spec":     map[string]any{"unschedulable": cordon},
	})
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = x.cfg.Client.CoreV1().Nodes().Patch(pctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	return err
}

// usable: gpuctl lets the node take ranks and it is a Ready, schedulable
// Node.
func (x *Executor) usable(node string) bool {
	if x.cfg.Usable != nil && !x.cfg.Usable(node) {
		return false
	}
	n, err := x.nodes.Get(node)
	return err == nil && !n.Spec.Unschedulable && ready(n) == corev1.ConditionTrue
}

// keptOff says why Kubernetes keeps pods off nodes, when every one of
// them is a Node it has ("" otherwise: a node Kubernetes does not have is
// the node's fault).
func (x *Executor) keptOff(nodes []string) string {
	var why []string
	for _, name := range nodes {
		n, err := x.nodes.Get(name)
		if err != nil {
			return ""
		}
		if w := keptOffWhy(ViewOf(n, x.cfg.Spec.GPUResource), false); w != "" {
			why = append(why, w)
		}
	}
	return strings.Join(why, "; ")
}

// nodeReady: the Node exists and its Ready condition is True.
func (x *Executor) nodeReady(node string) bool {
	n, err := x.nodes.Get(node)
	return err == nil && ready(n) == corev1.ConditionTrue
}

// ready is a Node's Ready condition ("" when it has none yet).
func ready(n *corev1.Node) corev1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status
		}
	}
	return ""
}

// ViaNodemon: a checkpoint (SIGUSR1) reaches the ranks through nodemon on
// their nodes (nodemon --kube-node finds them), which the API cannot do.
func (x *Executor) ViaNodemon(sig string) bool { return sig == "SIGUSR1" }

// Signal stops an attempt (every attempt of job when attempt is 0):
// SIGTERM deletes its objects with the stop grace, SIGKILL at once (and
// the job owner has nodemon kill the ranks too).
func (x *Executor) Signal(ctx context.Context, job string, attempt uint32, nodes []string, sig string) map[string]error {
	var grace time.Duration
	switch sig {
	case "SIGTERM":
		grace = x.cfg.StopGrace
	case "SIGKILL":
	default:
		err := fmt.Errorf("kubernetes: %s cannot reach pods through the API: nodemon on the node sends it", sig)
		out := map[string]error{}
		for _, n := range nodes {
			out[n] = err
		}
		return out
	}
	if err := x.remove(ctx, job, attempt, grace); err != nil {
		out := map[string]error{}
		for _, n := range nodes {
			out[n] = err
		}
		return out
	}
	return nil
}

// remove deletes an attempt's Job, pods and Service (attempt 0: every
// attempt of job); the pods get grace to stop.
func (x *Executor) remove(ctx context.Context, job string, attempt uint32, grace time.Duration) error {
	set := map[string]string{LabelJob: labelValue(job), LabelManaged: "gpuctl"}
	if attempt != 0 {
		set = AttemptLabels(job, attempt)
	}
	sel := labels.SelectorFromSet(set).String()
	secs := int64(grace / time.Second)
	bg := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{GracePeriodSeconds: &secs, PropagationPolicy: &bg}
	list := metav1.ListOptions{LabelSelector: sel}
	ns := x.cfg.Spec.Namespace
	var errs []error
	// The Job first, so its controller makes no new pod, then the pods
	// with the grace asked (the garbage collector would give them their
	// own), then the Service.
	if err := x.cfg.Client.BatchV1().Jobs(ns).DeleteCollection(ctx, opts, list); err != nil {
		errs = append(errs, fmt.Errorf("delete Jobs %s: %w", sel, err))
	}
	if err := x.cfg.Client.CoreV1().Pods(ns).DeleteCollection(ctx, opts, list); err != nil {
		errs = append(errs, fmt.Errorf("delete pods %s: %w", sel, err))
	}
	// A pod on a Node that is not Ready would wait for its kubelet to
	// confirm it stopped for ever: gpuctl has the node's ranks stopped by
	// nodemon, or counts them lost with the node, so its objects go now.
	if pods, err := x.cfg.Client.CoreV1().Pods(ns).List(ctx, list); err == nil {
		force := metav1.DeleteOptions{GracePeriodSeconds: new(int64)}
		for _, p := range pods.Items {
			if p.Spec.NodeName == "" || x.nodeReady(p.Spec.NodeName) {
				continue
			}
			if err := x.cfg.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, force); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete pod %s on %s, whose Node is not Ready: %w", p.Name, p.Spec.NodeName, err))
			}
		}
	}
	svcs, err := x.cfg.Client.CoreV1().Services(ns).List(ctx, list)
	if err != nil {
		errs = append(errs, fmt.Errorf("list Services %s: %w", sel, err))
	} else {
		for _, s := range svcs.Items {
			if err := x.cfg.Client.CoreV1().Services(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				errs = append(errs, fmt.Errorf("delete Service %s: %w", s.Name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("kubernetes: %w", unreachable(err))
	}
	return nil
}

// unreachable marks an error that is not the API server's answer (it
// could not be reached, or did not answer in time) as the executor's
// unavailability: the attempt waits in the queue with the reason rather
// than failing.
func unreachable(err error) error {
	var status apierrors.APIStatus
	if errors.As(err, &status) && !apierrors.IsServerTimeout(err) && !apierrors.IsTimeout(err) && !apierrors.IsServiceUnavailable(err) {
		return err
	}
	return fmt.Errorf("%w (%w: is the Kubernetes API server up?)", err, jobs.ErrExecutorUnavailable)
}

// checkAttempts tells the owner, once each, of the running attempts
// Kubernetes lost (on Run's goroutine).
func (x *Executor) checkAttempts() {
	if x.cfg.Owner == nil {
		return
	}
	v := x.cfg.Owner.View()
	if v == nil {
		return
	}
	views, err := x.nodeViews()
	if err != nil {
		return
	}
	var running []Running
	current := map[string]bool{}
	for _, j := range v.Jobs {
		if j.GetState() != api.JobState_JOB_STATE_RUNNING || j.GetStopping() != api.JobStop_JOB_STOP_NONE || len(j.GetPlacement()) == 0 {
			continue
		}
		name := ObjectName(j.GetId(), j.GetAttempt())
		kj, err := x.jobs.Jobs(x.cfg.Spec.Namespace).Get(name)
		if err != nil {
			continue // not one of gpuctl's attempts here (a foreign pod), or not made yet
		}
		key := gangKey(j.GetId(), strconv.FormatUint(uint64(j.GetAttempt()), 10))
		current[key] = true
		if x.lost[key] {
			continue
		}
		r := Running{Job: j.GetId(), Attempt: j.GetAttempt()}
		for _, jn := range j.GetPlacement() {
			r.Nodes = append(r.Nodes, jn.GetNode())
			for _, rk := range jn.GetRanks() {
				r.Started = r.Started || rk.GetPid() != 0 || rk.GetExited()
			}
		}
		for _, c := range kj.Status.Conditions {
			if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
				r.JobFailed = fmt.Sprintf("Job %s/%s failed (%s: %s; kubectl describe job -n %s %s)", kj.Namespace, kj.Name, c.Reason, c.Message, kj.Namespace, kj.Name)
			}
		}
		running = append(running, r)
	}
	for key := range x.lost {
		if !current[key] {
			delete(x.lost, key)
		}
	}
	for key := range x.unstarted {
		if !current[key] {
			delete(x.unstarted, key)
		}
	}
	for _, l := range LostAttempts(running, views) {
		key := gangKey(l.Job, strconv.FormatUint(uint64(l.Attempt), 10))
		if len(l.Nodes) == 0 {
			// nodemon finds a rank within its scan: a few checks before a
			// failed Job with none reported is called one that never started.
			if x.unstarted[key]++; x.unstarted[key] < 3 {
				continue
			}
		}
		x.lost[key] = true
		x.log.Warn("Kubernetes lost a running attempt", "job", l.Job, "attempt", l.Attempt, "nodes", l.Nodes, "why", l.Reason)
		x.cfg.Owner.ExecutorFailed(l.Job, l.Attempt, l.Nodes, l.Reason)
	}
}
