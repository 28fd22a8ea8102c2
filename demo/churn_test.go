package demo

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestNodemonKill9KeepsItsJob kills a nodemon with SIGKILL while a job
// runs on it and starts it again at once. The new nodemon presents the
// instance id kept in its data dir, so its session supersedes the dead
// one's without waiting for it to go silent: the node is never declared
// down, and the job keeps its attempt and its pids.
func TestNodemonKill9KeepsItsJob(t *testing.T) {
	c := newProcCluster(t, 2)
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	ctx := context.Background()
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: c.ringSpec("churn", 2) + "restart_policy: replace-node\n", Source: "churn test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 20*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 2) })
	name := NodeName(0)
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var oldAddr string
	for _, n := range nodes {
		if n.GetRegistration().GetName() == name {
			oldAddr = n.GetRemoteAddr()
		}
	}
	old := c.nodes[name]
	if err := old.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-old.done
	killed := time.Now()
	c.startNode(name)
	poll(t, 15*time.Second, name+" connected from its new nodemon", func() error {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if n.GetRegistration().GetName() != name {
				continue
			}
			if !n.GetConnected() || n.GetState() != api.NodeState_NODE_STATE_READY || n.GetRemoteAddr() == oldAddr {
				return fmt.Errorf("%s %s from %s", name, n.GetState().Short(), n.GetRemoteAddr())
			}
			return nil
		}
		return fmt.Errorf("%s not listed", name)
	})
	back := time.Since(killed)
	// Once the new session is in, the old one can no longer take the node
	// down: every down it caused is already stored.
	evs, err := cl.Events(ctx, &api.ListEventsRequest{Node: name})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.GetKind() == api.EventKind_EVENT_KIND_NODE_DOWN && e.GetTimeUnixNano() >= killed.UnixNano() {
			t.Errorf("%s declared down after its nodemon restarted: %s", name, e.GetMessage())
		}
	}
	// The restarted nodemon re-adopted the ranks and reported them; the
	// job never left its attempt.
	poll(t, 10*time.Second, "job keeps attempt 1 and its pids", func() error { return c.checkSamePIDs(cl, running) })
	t.Logf("nodemon killed -9 and restarted: back %.2fs after the kill, job attempt 1 with pids %v", back.Seconds(), rankPIDs(running))
}
