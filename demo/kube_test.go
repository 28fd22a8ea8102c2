package demo

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
	"github.com/gpuctl/gpuctl/controlplane/kube"
	"github.com/gpuctl/gpuctl/internal/kubetest"
)

// kubeGpuctl is a real Kubernetes (internal/kubetest: kubelets kn-1..kn-N
// with their own containerd), a real `gpuctl serve --executor kubernetes`
// and one nodemon per Node, named as the Node and finding the ranks of
// gpuctl's pods on it (--kube-node).
type kubeGpuctl struct {
	*procCluster
	kube   *kubetest.Cluster
	cs     kubernetes.Interface
	runDir string
	cl     *client.Client
}

func newKubeGpuctl(t *testing.T, nodes int) *kubeGpuctl {
	t.Helper()
	kubetest.Require(t, true)
	nodemon, ringtrain := binaries(t)
	dir := t.TempDir()
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("kn-%d", i+1)
	}
	kc := kubetest.Start(t, kubetest.Options{Nodes: names, Images: []string{kubetest.RanksArchive(t, dir, nodemon, ringtrain)}})
	runDir := filepath.Join(dir, "kube-run")
	c, cl := executorCluster(t, dir, names, "--kube-node", "--executor", "kubernetes", "--kubeconfig", kc.Admin, "--namespace", "default",
		"--kube-image", kubetest.RanksImage, "--kube-pull-policy", "Never", "--kube-run-dir", runDir,
		// No device plugin here: the pods ask for no nvidia.com/gpu.
		"--kube-gpu-resource", "", "--kube-stop-grace", "2s")
	return &kubeGpuctl{procCluster: c, kube: kc, cs: kc.Client(), runDir: runDir, cl: cl}
}

// ringJob is ringtrain (the image's) on two nodes, two ranks each, with a
// checkpoint directory every node mounts at the same path.
func (s *kubeGpuctl) ringJob(name string) string {
	return fmt.Sprintf(`name: %s
nodes: 2
gpus_per_node: 2
command: [/opt/ringtrain, --steps, "0", --compute-ms, "30", --bytes, 64K]
checkpoint: {dir: %q, interval: 1h}
restart_policy: replace-node
`, name, filepath.Join(s.dir, "ckpt", name))
}

func (s *kubeGpuctl) submit(spec string) string {
	s.t.Helper()
	r, err := s.cl.SubmitJob(context.Background(), &api.SubmitJobRequest{SpecYaml: spec, Source: "kubernetes test"})
	if err != nil {
		s.t.Fatal(err)
	}
	return r.GetJob().GetId()
}

// pods are an attempt's pods by node (every attempt of job with attempt
// 0), those being deleted included.
func (s *kubeGpuctl) pods(job string, attempt uint32) (map[string]string, error) {
	set := map[string]string{kube.LabelJob: job, kube.LabelManaged: "gpuctl"}
	if attempt != 0 {
		set = kube.AttemptLabels(job, attempt)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := s.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(set).String()})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range list.Items {
		out[p.Name] = p.Spec.NodeName + "/" + string(p.Status.Phase)
	}
	return out, nil
}

// TestKubeExecutor runs gpuctl's jobs on a real Kubernetes: ringtrain
// across two kubelets as pods gpuctl binds to the nodes it placed, its
// ranks reported and traced by the nodemons, a checkpoint through nodemon,
// a kubelet stopped (its Node goes NotReady): the job runs again on the
// others from its checkpoint with no pod of the old attempt left; and an
// API server outage: a job submitted meanwhile waits, saying why, and runs
// once it is back.
func TestKubeExecutor(t *testing.T) {
	s := newKubeGpuctl(t, 3)
	ctx := context.Background()

	// Submit → every rank running (pods bound and started), a few times.
	var starts []time.Duration
	for i := 0; i < 3; i++ {
		t0 := time.Now()
		id := s.submit(s.ringJob(fmt.Sprintf("warm%d", i)))
		waitFor(t, s.cl, id, 60*time.Second, "ranks running", func(j *api.Job) error { return runningWith(j, 1, 4) })
		starts = append(starts, time.Since(t0))
		cancelJob(t, s.cl, id)
		poll(t, 30*time.Second, "the cancelled job's pods are gone", func() error {
			if pods, err := s.pods(id, 0); err != nil || len(pods) > 0 {
				return fmt.Errorf("pods %v (%v)", pods, err)
			}
			return nil
		})
	}
	t.Logf("gpuctl submit → 4 ranks running as pods: median %v of %v", median(starts), starts)

	id := s.submit(s.ringJob("rt"))
	j := waitFor(t, s.cl, id, 60*time.Second, "attempt 1 running", func(j *api.Job) error { return runningWith(j, 1, 4) })
	first := nodesOf(j)
	// The pods run where gpuctl placed them.
	pods, err := s.pods(id, 1)
	if err != nil {
		t.Fatal(err)
	}
	var podNodes []string
	for _, at := range pods {
		node, _, _ := strings.Cut(at, "/")
		podNodes = append(podNodes, node)
	}
	if slices.Sort(podNodes); !slices.Equal(podNodes, slices.Sorted(slices.Values(first))) {
		t.Fatalf("attempt 1's pods run on %v, gpuctl placed it on %v", podNodes, first)
	}
	observed(t, s.cl, id, 4)

	// A checkpoint through nodemon lands.
	ckpt := checkpointed(t, s.cl, id, 30*time.Second)
	t.Logf("checkpoint at step %d through nodemon", ckpt)

	// One of its nodes' kubelet stops: the Node goes NotReady.
	lost := first[1]
	t0 := time.Now()
	s.kube.StopKubelet(lost)
	s.kube.WaitNodeReady(lost, false, 60*time.Second)
	notReady := time.Now()
	j = movedOff(t, s.cl, id, lost, 90*time.Second)
	requeue := time.Since(t0)
	if j.GetResumeStep() < ckpt {
		t.Fatalf("attempt %d resumes from step %d, before the checkpoint at %d", j.GetAttempt(), j.GetResumeStep(), ckpt)
	}
	for a := uint32(1); a < j.GetAttempt(); a++ {
		if old, err := s.pods(id, a); err != nil || len(old) > 0 {
			t.Fatalf("attempt %d running, attempt %d's pods still there: %v (%v)", j.GetAttempt(), a, old, err)
		}
	}
	resumedFrom(t, filepath.Join(s.runDir, api.KubeRunName(id, j.GetAttempt()), "rank-0.log"), ckpt)
	t.Logf("kubelet of %s stopped → attempt %d running on %v from step %d in %v (Node NotReady after %v, then running %v later)",
		lost, j.GetAttempt(), nodesOf(j), j.GetResumeStep(), requeue, notReady.Sub(t0), requeue-notReady.Sub(t0))
	cancelJob(t, s.cl, id)

	// The API server goes away: a job submitted meanwhile waits with the
	// reason, and runs once it is back.
	s.kube.StopAPIServer()
	patient := s.submit(s.ringJob("patient"))
	waitFor(t, s.cl, patient, 60*time.Second, "the job waits, saying why", func(j *api.Job) error {
		if !strings.Contains(j.GetReason(), "Kubernetes API server") {
			return fmt.Errorf("%s: %q", j.GetState(), j.GetReason())
		}
		return nil
	})
	s.kube.StartAPIServer()
	t0 = time.Now()
	waitFor(t, s.cl, patient, 120*time.Second, "running once the API server is back", func(j *api.Job) error {
		return runningWith(j, j.GetAttempt(), 4)
	})
	t.Logf("API server back → the waiting job running in %v", time.Since(t0))
	if n, err := s.cs.CoreV1().Nodes().Get(ctx, lost, metav1.GetOptions{}); err == nil {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				t.Errorf("%s Ready again without its kubelet", lost)
			}
		}
	}
}
