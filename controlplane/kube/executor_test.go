package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/internal/kubetest"
	"github.com/gpuctl/gpuctl/internal/testbin"
)

const ranksImage = kubetest.RanksImage

// ranksArchive builds the ranks image from this tree's nodemon and
// ringtrain.
func ranksArchive(t *testing.T, dir string) string {
	t.Helper()
	return kubetest.RanksArchive(t, dir, testbin.Nodemon(t), testbin.Ringtrain(t))
}

// ringLaunch is an attempt of ringtrain with two ranks on each of nodes,
// rank 0's node its master (every node is this host: 127.0.0.1).
func ringLaunch(t *testing.T, job string, attempt uint32, nodes []string) jobs.AttemptLaunch {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	a := jobs.AttemptLaunch{Job: job, Attempt: attempt, Nodes: nodes, Ranks: map[string]*api.LaunchRanks{}}
	for i, n := range nodes {
		a.Ranks[n] = &api.LaunchRanks{
			Job: job, Attempt: attempt, WorldSize: int32(2 * len(nodes)), MasterAddr: "127.0.0.1", MasterPort: uint32(port),
			NodeRank: int32(i), NumNodes: int32(len(nodes)),
			Command: []string{"/opt/ringtrain", "--steps", "5", "--compute-ms", "0", "--bytes", "64K"},
			Ranks: []*api.RankSpec{
				{Rank: int32(2 * i), LocalRank: 0, Gpus: []uint32{0}},
				{Rank: int32(2*i + 1), LocalRank: 1, Gpus: []uint32{1}},
			},
		}
	}
	return a
}

func startExecutor(t *testing.T, cs kubernetes.Interface, runDir string) *Executor {
	t.Helper()
	x := New(Config{Client: cs, StopGrace: 2 * time.Second,
		Spec: Spec{Namespace: "default", Image: ranksImage, PullPolicy: corev1.PullNever, HostNetwork: true, Cluster: "kubetest", RunDir: runDir}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- x.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("executor: %v", err)
		}
	})
	return x
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(limit)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v; last: %s", what, limit, last)
}

func attemptPods(t *testing.T, cs kubernetes.Interface, job string, attempt uint32) []corev1.Pod {
	t.Helper()
	list, err := cs.CoreV1().Pods("default").List(context.Background(), metav1.ListOptions{
		LabelSelector: labels.SelectorFromSet(AttemptLabels(job, attempt)).String()})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// TestAttemptRunsAsBoundPods: an attempt of ringtrain on two of three real
// kubelets becomes an Indexed Job whose pods gpuctl binds, each to the
// node its rank order places it on (none to the third); the ranks get
// exactly gpuctl's rank environment, meet at rank 0 and finish, and the
// Job completes. SIGTERM then deletes every object of the attempt. A gang
// placed on a node Kubernetes does not have is undone: its Job and pods
// are deleted and Launch says why. A job's next attempt waits until its
// last attempt's pods are gone (they are deleted).
func TestAttemptRunsAsBoundPods(t *testing.T) {
	kubetest.Require(t, true)
	dir := t.TempDir()
	c := kubetest.Start(t, kubetest.Options{Nodes: []string{"kn-1", "kn-2", "kn-3"}, Images: []string{ranksArchive(t, dir)}})
	cs := c.Client()
	x := startExecutor(t, cs, filepath.Join(dir, "run"))

	a := ringLaunch(t, "j-ring01", 1, []string{"kn-3", "kn-1"})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	start := time.Now()
	if errs := x.Launch(ctx, a); errs != nil {
		t.Fatalf("launch: %v", errs)
	}
	bound := time.Since(start)
	for _, p := range attemptPods(t, cs, a.Job, a.Attempt) {
		idx := p.Annotations[batchv1.JobCompletionIndexAnnotation]
		want := map[string]string{"0": "kn-3", "1": "kn-1"}[idx]
		if p.Spec.NodeName != want {
			t.Errorf("pod %s (index %s) bound to %q, placed on %q", p.Name, idx, p.Spec.NodeName, want)
		}
	}
	name := ObjectName(a.Job, a.Attempt)
	waitFor(t, 90*time.Second, "the Job completes", func() (bool, string) {
		j, err := cs.BatchV1().Jobs("default").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range j.Status.Conditions {
			if cond.Type == batchv1.JobFailed && cond.Status == corev1.ConditionTrue {
				t.Fatalf("the Job failed: %s: %s", cond.Reason, cond.Message)
			}
		}
		return j.Status.Succeeded == 2, fmt.Sprintf("succeeded %d, active %d, failed %d", j.Status.Succeeded, j.Status.Active, j.Status.Failed)
	})
	t.Logf("launch → all pods bound: %v; → Job complete: %v", bound, time.Since(start))
	// Each rank's log is in the run dir on its node: rank 0's stop line
	// says the four ranks met.
	logs, err := os.ReadFile(filepath.Join(dir, "run", api.KubeRunName(a.Job, a.Attempt), "rank-0.log"))
	if err != nil || !strings.Contains(string(logs), "stop step=5 reason=steps") {
		t.Errorf("rank 0's log (%v):\n%s", err, logs)
	}

	if errs := x.Signal(context.Background(), a.Job, a.Attempt, a.Nodes, "SIGTERM"); errs != nil {
		t.Fatalf("SIGTERM: %v", errs)
	}
	waitFor(t, 30*time.Second, "the attempt's objects are gone", func() (bool, string) {
		pods := attemptPods(t, cs, a.Job, a.Attempt)
		_, jerr := cs.BatchV1().Jobs("default").Get(context.Background(), name, metav1.GetOptions{})
		_, serr := cs.CoreV1().Services("default").Get(context.Background(), name, metav1.GetOptions{})
		return len(pods) == 0 && jerr != nil && serr != nil, fmt.Sprintf("%d pods, job err %v, service err %v", len(pods), jerr, serr)
	})

	bad := ringLaunch(t, "j-nowhere", 1, []string{"kn-2", "kn-9"})
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	errs := x.Launch(ctx2, bad)
	if errs == nil || !strings.Contains(fmt.Sprint(errs["kn-9"]), "no longer usable: [kn-9]") {
		t.Fatalf("a gang placed on a missing node: %v, want it undone naming kn-9", errs)
	}
	waitFor(t, 30*time.Second, "the undone attempt's objects are gone", func() (bool, string) {
		pods := attemptPods(t, cs, bad.Job, bad.Attempt)
		bound := 0
		for _, p := range pods {
			if p.Spec.NodeName != "" {
				bound++
			}
		}
		if bound > 0 {
			t.Fatalf("an undone gang had %d pods bound", bound)
		}
		_, jerr := cs.BatchV1().Jobs("default").Get(context.Background(), ObjectName(bad.Job, bad.Attempt), metav1.GetOptions{})
		return len(pods) == 0 && jerr != nil, fmt.Sprintf("%d pods, job err %v", len(pods), jerr)
	})

	// The next attempt of a job never starts beside the last one's pods:
	// they are deleted, and the launch waits until they are gone.
	long := ringLaunch(t, "j-long", 1, []string{"kn-1", "kn-2"})
	for _, l := range long.Ranks {
		l.Command = []string{"/opt/ringtrain", "--steps", "0", "--compute-ms", "20", "--bytes", "64K"}
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel3()
	if errs := x.Launch(ctx3, long); errs != nil {
		t.Fatalf("launch j-long attempt 1: %v", errs)
	}
	next := ringLaunch(t, "j-long", 2, []string{"kn-2", "kn-3"})
	errs = x.Launch(ctx3, next)
	if err := errs["kn-2"]; !errors.Is(err, jobs.ErrExecutorUnavailable) || !strings.Contains(err.Error(), "earlier attempt") {
		t.Fatalf("attempt 2 beside attempt 1's running pods: %v, want it to wait for them", errs)
	}
	waitFor(t, 30*time.Second, "attempt 1's pods are gone", func() (bool, string) {
		pods := attemptPods(t, cs, long.Job, 1)
		return len(pods) == 0, fmt.Sprintf("%d pods", len(pods))
	})
	if errs := x.Launch(ctx3, next); errs != nil {
		t.Fatalf("attempt 2 once attempt 1 is gone: %v", errs)
	}
	if errs := x.Signal(context.Background(), next.Job, 0, next.Nodes, "SIGKILL"); errs != nil {
		t.Fatalf("SIGKILL: %v", errs)
	}
}
