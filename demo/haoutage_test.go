package demo

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/client"
)

// envDuration is the duration in the environment variable name (a test's
// length, set by a make target), or def when it is unset.
func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a duration such as 30s or 10m", name, v)
	}
	return d
}

// etcdOutage is how long TestHAEtcdOutage keeps etcd away: 20 s in make
// test, longer from make soak (GPUCTL_ETCD_OUTAGE=2m).
func etcdOutage(t *testing.T) time.Duration {
	t.Helper()
	return envDuration(t, "GPUCTL_ETCD_OUTAGE", 20*time.Second)
}

// TestHAEtcdOutage kills every etcd member of a control plane of two
// servers while one nodemon runs ranks, keeps etcd away well past the
// servers' session TTL (2 s), and starts it again. Meanwhile the control
// plane is read-only: status says so and why, reads are answered, and a
// submit or a cordon is refused at once with the reason (not left
// hanging). Once etcd is back a server leads again within seconds, every
// write acknowledged before the outage is there, and changes are taken
// again.
//
// The servers grant their default lease (20 s), no longer than the 20 s
// outage, and the one node has no other to vouch for it: its ranks live
// because the leader goes on renewing their leases while etcd is away (it
// keeps its node sessions), and afterwards they are the same attempt and
// pids. The longer variant (make soak-etcd) outlasts the lease many times.
func TestHAEtcdOutage(t *testing.T) {
	outage := etcdOutage(t)
	c := newHACluster(t, 1)
	cl := c.dial(10 * time.Second)
	defer cl.Close()
	ctx := context.Background()
	node := NodeName(0)
	spec := fmt.Sprintf("name: outage\nnodes: 1\ngpus_per_node: 4\ncommand: [%q, --steps, \"0\", --compute-ms, \"30\", --bytes, 64K]\n", c.ringtain)
	r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "etcd outage test"})
	if err != nil {
		t.Fatal(err)
	}
	running := waitFor(t, cl, r.GetJob().GetId(), 30*time.Second, "running", func(j *api.Job) error { return runningWith(j, 1, 4) })

	// Acknowledged just before etcd goes: a cordon and a join token.
	if _, err := cl.Cordon(ctx, node, "cordon", "acknowledged before the etcd outage"); err != nil {
		t.Fatal(err)
	}
	_, tok, err := cl.CreateJoinToken(ctx, client.TokenOptions{TTL: time.Hour, Uses: 1, Description: "made before the etcd outage"})
	if err != nil {
		t.Fatal(err)
	}

	c.etcd.KillAll()
	killed := time.Now()
	var st *api.StatusResponse
	poll(t, 10*time.Second, "status says read-only", func() error {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		s, err := cl.Status(sctx)
		if err != nil {
			return err
		}
		if !s.GetReadOnly() || s.GetStoreHealthy() {
			return fmt.Errorf("read-only %v, store healthy %v", s.GetReadOnly(), s.GetStoreHealthy())
		}
		st = s
		return nil
	})
	t.Logf("etcd killed → status read-only after %.2fs: %s", time.Since(killed).Seconds(), st.GetReadOnlyReason())
	if !strings.Contains(st.GetReadOnlyReason(), "read-only") {
		t.Errorf("the read-only reason does not say so: %q", st.GetReadOnlyReason())
	}

	// Changes are refused promptly, with the reason; reads are answered.
	refused := func(what string, change func(context.Context) error) {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 8*time.Second)
		defer cancel()
		start := time.Now()
		err := change(cctx)
		took := time.Since(start)
		t.Logf("%s during the outage: answered in %.3fs: %v", what, took.Seconds(), err)
		switch {
		case err == nil:
			t.Errorf("%s was accepted while etcd is away", what)
		case !strings.Contains(err.Error(), "read-only") || !strings.Contains(err.Error(), "unreachable"):
			t.Errorf("%s refused without the reason: %v", what, err)
		}
		if took > 1500*time.Millisecond {
			t.Errorf("%s took %s to be answered, want about 1 s at most", what, took)
		}
	}
	refused("submit", func(ctx context.Context) error {
		_, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: strings.Replace(spec, "name: outage", "name: refused", 1), Source: "etcd outage test"})
		return err
	})
	refused("cordon", func(ctx context.Context) error {
		_, err := cl.Cordon(ctx, node, "uncordon", "")
		return err
	})

	// Until etcd returns: reads answered, still read-only, the ranks
	// running as they were.
	for time.Since(killed) < outage {
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		s, err := cl.Status(sctx)
		cancel()
		if err != nil {
			t.Fatalf("status %.1fs into the outage: %v\n%s", time.Since(killed).Seconds(), err, c.logs())
		}
		if !s.GetReadOnly() {
			t.Fatalf("%.1fs into the outage the control plane is not read-only", time.Since(killed).Seconds())
		}
		if _, err := cl.Nodes(ctx); err != nil {
			t.Fatalf("nodes %.1fs into the outage: %v", time.Since(killed).Seconds(), err)
		}
		if err := c.checkSamePIDs(cl, running); err != nil {
			t.Fatalf("%.1fs into the outage: %v\n%s", time.Since(killed).Seconds(), err, c.logs())
		}
		time.Sleep(time.Second) // pacing the samples, not waiting for a result
	}

	c.etcd.RestartAll()
	back := time.Now()
	t.Logf("etcd away %.1fs; all members serving again", back.Sub(killed).Seconds())
	if err := waitUntil(30*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := cl.Cordon(cctx, node, "uncordon", "")
		return err
	}); err != nil {
		t.Fatalf("no change accepted after etcd's return: %v\n%s", err, c.logs())
	}
	accepted := time.Since(back)
	st = c.waitAnyLeader(cl, 10*time.Second)
	t.Logf("etcd back → a change accepted after %.2fs; %s leads (%d leadership changes recorded)", accepted.Seconds(), st.GetLeader().GetName(), len(st.GetLeadership()))
	if accepted > 15*time.Second {
		t.Errorf("a change was accepted %s after etcd's return, want within seconds", accepted)
	}
	if st.GetReadOnly() {
		t.Errorf("still read-only once etcd is back: %s", st.GetReadOnlyReason())
	}
	toks, err := cl.ListTokens(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasToken(toks, tok.GetId()) {
		t.Errorf("the join token made before the outage is lost")
	}
	evs, err := cl.Events(ctx, &api.ListEventsRequest{Node: node, Limit: 200})
	if err != nil {
		t.Fatal(err)
	}
	if !hasEvent(evs, "acknowledged before the etcd outage") {
		t.Errorf("the cordon acknowledged before the outage is not in the node's events")
	}
	if err := c.checkSamePIDs(cl, running); err != nil {
		t.Fatalf("after the outage: %v\n%s", err, c.logs())
	}
}

// waitAnyLeader waits until the control plane names a leader that is
// not read-only.
func (c *haCluster) waitAnyLeader(cl *client.Client, limit time.Duration) *api.StatusResponse {
	c.t.Helper()
	var st *api.StatusResponse
	poll(c.t, limit, "a leader", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := cl.Status(ctx)
		if err != nil {
			return err
		}
		if s.GetLeader().GetName() == "" || s.GetReadOnly() {
			return fmt.Errorf("leader %q, read-only %v", s.GetLeader().GetName(), s.GetReadOnly())
		}
		st = s
		return nil
	})
	return st
}

func hasEvent(evs []*api.Event, text string) bool {
	for _, e := range evs {
		if strings.Contains(e.GetMessage(), text) {
			return true
		}
	}
	return false
}
