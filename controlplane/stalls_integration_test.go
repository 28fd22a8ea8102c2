package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/jobs"
	"github.com/gpuctl/gpuctl/internal/needs"
)

// poll calls ok until it returns nil or limit passes, then fails with its
// last error.
func poll(t *testing.T, limit time.Duration, what string, ok func() error) {
	t.Helper()
	if err := waitUntil(limit, ok); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitUntil calls ok until it returns nil or limit passes, and returns its
// last error.
func waitUntil(limit time.Duration, ok func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := ok()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOpsOnRealNodes runs a real server and three real nodemons: a
// cordoned node gets no new job until it is uncordoned; `gpuctl logs`
// relays a rank's step lines, once and following; and a rank stopped with
// SIGSTOP is named as the one stalling its job's communicator within the
// job's stall threshold plus 2 s, the stall clearing after SIGCONT.
func TestOpsOnRealNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real nodemon processes")
	}
	if os.Geteuid() != 0 {
		needs.EBPF.Skip(t, "stall detection needs eBPF uprobes on the ranks' NCCL, which need root; run as root")
	}
	ebpf := "auto"
	if needs.EBPF.Required() {
		ebpf = "required"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	c, cl := realCluster(t, 3, ebpf)
	passes := &jobs.PassCount{}
	c.Server.SetObserver(passes)
	ringtrain := c.Options().Ringtrain
	submit := func(spec string) string {
		t.Helper()
		r, err := cl.SubmitJob(ctx, &api.SubmitJobRequest{SpecYaml: spec, Source: "test"})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetJob().GetId()
	}
	train := fmt.Sprintf("command: [%s, --steps, \"0\", --compute-ms, \"50\", --bytes, 64K]\n", ringtrain)
	ring := submit("name: stally\nnodes: 2\ngpus_per_node: 2\nstall_threshold: 2s\n" + train)
	j := waitJob(t, cl, ring, 20*time.Second, "running with pids", runningWithPIDs)
	t.Logf("cluster and job up in %.1fs", time.Since(began).Seconds())

	// Cordon: the one node the ring job left whole takes no 8-GPU job
	// while cordoned, and takes it once uncordoned.
	free := ""
	for _, n := range c.NodeNames {
		if !slices.Contains(nodeNames(j), n) {
			free = n
		}
	}
	r, err := cl.Cordon(ctx, free, "cordon", "integration test")
	if err != nil {
		t.Fatal(err)
	}
	if n := r.GetNode(); n.GetState() != api.NodeState_NODE_STATE_READY || !n.GetCordoned() || n.GetCordonReason() != "integration test" {
		t.Fatalf("cordon answered %v", r.GetNode())
	}
	whole := submit("name: whole\nnodes: 1\ngpus_per_node: 8\n" + train)
	waitJob(t, cl, whole, 5*time.Second, "pending because of the cordon", func(j *api.Job) error {
		if j.GetState() != api.JobState_JOB_STATE_PENDING || !strings.Contains(j.GetPendingReason(), "cordoned") {
			return fmt.Errorf("state %s, pending reason %q", j.GetState(), j.GetPendingReason())
		}
		return nil
	})
	// Three more scheduling passes, each of which would place the job were
	// the cordon ignored.
	seen := passes.Passes()
	poll(t, 10*time.Second, "three more scheduling passes", func() error {
		if n := passes.Passes() - seen; n < 3 {
			return fmt.Errorf("%d passes so far", n)
		}
		return nil
	})
	if js, err := cl.Jobs(ctx, whole); err != nil || js[0].GetState() != api.JobState_JOB_STATE_PENDING {
		t.Fatalf("job on a cordoned node: %v %v", js, err)
	}
	if _, err := cl.Cordon(ctx, free, "uncordon", ""); err != nil {
		t.Fatal(err)
	}
	w := waitJob(t, cl, whole, 10*time.Second, "running once uncordoned", runningWithPIDs)
	if got := nodeNames(w); !slices.Equal(got, []string{free}) {
		t.Fatalf("whole job placed on %v, want %s", got, free)
	}
	if _, err := cl.CancelJob(ctx, whole); err != nil {
		t.Fatal(err)
	}

	// Logs: rank 0's step lines, read once, then followed.
	poll(t, 10*time.Second, "rank 0's log shows steps", func() error {
		var b bytes.Buffer
		if err := cl.Logs(ctx, &api.LogsRequest{Job: ring}, func(ch *api.LogsChunk) error {
			b.Write(ch.GetData())
			return nil
		}); err != nil {
			return err
		}
		if !strings.Contains(b.String(), "\nstep ") {
			return fmt.Errorf("log so far:\n%s", b.String())
		}
		return nil
	})
	errEnough := errors.New("enough")
	var followed bytes.Buffer
	fctx, fcancel := context.WithTimeout(ctx, 15*time.Second)
	err = cl.Logs(fctx, &api.LogsRequest{Job: "stally", Rank: 3, Follow: true, TailBytes: 1}, func(ch *api.LogsChunk) error {
		followed.Write(ch.GetData())
		if strings.Count(followed.String(), "\nstep ") >= 3 {
			return errEnough
		}
		return nil
	})
	fcancel()
	if !errors.Is(err, errEnough) {
		t.Fatalf("following rank 3's log: %v after\n%s", err, followed.String())
	}
	if err := cl.Logs(ctx, &api.LogsRequest{Job: ring, Rank: 9}, func(*api.LogsChunk) error { return nil }); err == nil || !strings.Contains(err.Error(), "no rank 9") {
		t.Errorf("logs of a rank the job lacks: %v", err)
	}

	// eBPF must see the job's collectives, or there is nothing to detect.
	// The wait runs in full wherever this test runs; only its end decides
	// between a skip (eBPF not required here) and a failure.
	if err := waitUntil(10*time.Second, func() error {
		cs, err := cl.Collectives(ctx, ring, "")
		if err != nil {
			return err
		}
		for _, s := range cs {
			if s.GetOp() == api.NCCLOp_NCCL_OP_ALL_REDUCE && s.GetSeq() > 0 {
				return nil
			}
		}
		return fmt.Errorf("no traced allreduce among %d aggregates", len(cs))
	}); err != nil {
		needs.EBPF.Skip(t, "no NCCL calls traced within 10s (%v; see %s/nodes/*/nodemon.log)", err, c.Options().DataDir)
	}

	// Stall: SIGSTOP rank 2, which must be named alone, then SIGCONT.
	var node string
	var pid int
	for _, jn := range j.GetPlacement() {
		for _, rk := range jn.GetRanks() {
			if rk.GetRank() == 2 {
				node, pid = jn.GetNode(), int(rk.GetPid())
			}
		}
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	stopped := time.Now()
	// Each communicator the stop holds up is a stall (ringtrain has two:
	// its data ring and its control one), and each names rank 2 as the
	// stopped one. A rank that waits inside the ring for rank 2 while the
	// others are past the call may be listed as lagging too, but never as
	// stopped; every rank is listed, lagging or waiting.
	var stall *api.Stall
	poll(t, 4*time.Second, "stall naming rank 2 within threshold + 2s", func() error {
		stalls, err := cl.ListStalls(ctx, ring)
		if err != nil {
			return err
		}
		if len(stalls) == 0 {
			return errors.New("no stall")
		}
		stall = nil
		for _, st := range stalls {
			named := false
			for _, lag := range st.GetLaggingRanks() {
				switch {
				case lag.GetRank() == 2 && lag.GetPid() == uint32(pid) && lag.GetNode() == node && lag.GetProcState() == "T":
					named = true
				case lag.GetProcState() == "T":
					return fmt.Errorf("rank %d listed as stopped, only rank 2 is: %v", lag.GetRank(), st)
				}
			}
			if !named || !strings.Contains(st.GetDiagnosis(), fmt.Sprintf("rank 2 (%s pid %d) is stopped", node, pid)) {
				return fmt.Errorf("stall does not name rank 2 (%s pid %d) stopped: %v", node, pid, st)
			}
			if n := len(st.GetLaggingRanks()) + len(st.GetWaitingRanks()); n != 4 {
				return fmt.Errorf("stall lists %d of the 4 ranks: %v", n, st)
			}
		}
		stall = stalls[0]
		return nil
	})
	t.Logf("stall declared %.1fs after SIGSTOP: %s", time.Since(stopped).Seconds(), stall.GetDiagnosis())
	if js, err := cl.Jobs(ctx, ring); err != nil || !js[0].GetStalled() {
		t.Errorf("job not marked stalled: %v", err)
	}
	evs, err := cl.Events(ctx, &api.ListEventsRequest{SinceUnixNano: stopped.UnixNano()})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(evs, func(e *api.Event) bool {
		return e.GetKind() == api.EventKind_EVENT_KIND_STALL && e.GetJob() == ring && e.GetRank() == 2 && e.GetPid() == uint32(pid)
	}) {
		t.Errorf("no stall event for rank 2 among %d events", len(evs))
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	poll(t, 5*time.Second, "stall cleared after SIGCONT", func() error {
		stalls, err := cl.ListStalls(ctx, "")
		if err != nil {
			return err
		}
		if len(stalls) > 0 {
			return fmt.Errorf("still %v", stalls)
		}
		js, err := cl.Jobs(ctx, ring)
		if err != nil {
			return err
		}
		if js[0].GetStalled() {
			return errors.New("job still marked stalled")
		}
		return nil
	})
	t.Logf("whole test %.1fs", time.Since(began).Seconds())
}
