package jobs

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

// TestReadOnlyKeepsWhatHappened: while the store is away (the control
// plane read-only) the owner refuses requests at once with the reason,
// schedules nothing, stores nothing and sends no command, but keeps what it
// hears; once the store is back, a node lost meanwhile is stored and its
// job recovered.
func TestReadOnlyKeepsWhatHappened(t *testing.T) {
	h := newHarness(t, "fifo", threeNodes()...)
	var away atomic.Bool
	errAway := errors.New("the store (etcd at http://127.0.0.1:2379) is unreachable since 2026-01-01T00:00:00Z: the control plane is read-only; retry when it returns")
	h.m.cfg.ReadOnly = func() error {
		if away.Load() {
			return errAway
		}
		return nil
	}
	id := h.submit(ringSpec("ring", 2, 4, "restart_policy: replace-node\n"), false)
	h.reconcile()
	h.started(id)
	h.nodes.take()

	away.Store(true)
	if _, err := h.submitReq(&api.SubmitJobRequest{SpecYaml: ringSpec("more", 1, 1, ""), Source: "test"}); !errors.Is(err, errAway) {
		t.Fatalf("a submit while read-only: %v, want the read-only reason", err)
	}
	lost := nodesOf(h.job(id))[1]
	h.nodes.update(lost, func(n *api.NodeStatus) {
		n.State, n.Connected, n.Stale = api.NodeState_NODE_STATE_DOWN, false, true
	})
	h.nodeDown(lost, "no heartbeat for 2.1s")
	h.reconcile()
	if j := h.job(id); j.GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("while read-only the committed job became %s (%s)", stateName(j.GetState()), j.GetReason())
	}
	if j, err := h.st.Job(id); err != nil || j.GetState() != api.JobState_JOB_STATE_RUNNING {
		t.Fatalf("while read-only the stored job is %v (%v)", j.GetState(), err)
	}
	if cmds := h.nodes.take(); len(cmds) != 0 {
		t.Fatalf("commands sent while read-only: %v", cmds)
	}
	if js, _ := h.m.List(""); len(js) != 1 {
		t.Fatalf("%d jobs listed, want the one submitted before", len(js))
	}

	away.Store(false)
	h.reconcile()
	j, err := h.st.Job(id)
	if err != nil {
		t.Fatal(err)
	}
	if j.GetState() != api.JobState_JOB_STATE_RECOVERING || !strings.Contains(j.GetReason(), lost) {
		t.Fatalf("once the store is back the stored job is %s (%s), want recovering from the loss of %s", stateName(j.GetState()), j.GetReason(), lost)
	}
	if len(h.nodes.take()) == 0 {
		t.Error("no command sent once the store was back (the survivors are stopped by the recovery)")
	}
}
