package views

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// StallJSON is one NCCL stall in `gpuctl stalls -o json`.
type StallJSON struct {
	Job string `json:"job"`
	// Comm is the communicator's handle in the lowest rank's memory.
	Comm         string            `json:"comm"`
	LaggingRanks []StalledRankJSON `json:"lagging_ranks"`
	// WaitingRanks are the ranks held up by the lagging ones.
	WaitingRanks     []int32    `json:"waiting_ranks"`
	Since            *time.Time `json:"since_time"`
	StalledSeconds   *float64   `json:"stalled_seconds"`
	ThresholdSeconds float64    `json:"threshold_seconds"`
	Diagnosis        string     `json:"diagnosis"`
}

// StalledRankJSON is a rank holding a communicator up: where it is (the
// op and seq it sits in when in_call, else the last it completed) and its
// process state (T stopped, R running, S sleeping, D blocked, Z exited).
type StalledRankJSON struct {
	Rank      int32   `json:"rank"`
	Node      string  `json:"node"`
	PID       uint32  `json:"pid"`
	Op        string  `json:"op"`
	Seq       uint64  `json:"seq"`
	InCall    bool    `json:"in_call"`
	ProcState *string `json:"proc_state"`
}

// StallFromAPI converts a stall to its JSON view; now gives its duration.
func StallFromAPI(s *api.Stall, now time.Time) StallJSON {
	out := StallJSON{Job: s.GetJob(), Comm: fmt.Sprintf("%#x", s.GetComm()), LaggingRanks: []StalledRankJSON{},
		WaitingRanks: []int32{}, Since: optTime(s.GetSinceUnixNano()), ThresholdSeconds: time.Duration(s.GetThresholdNs()).Seconds(),
		Diagnosis: s.GetDiagnosis()}
	if out.Since != nil {
		out.StalledSeconds = ptr(max(now.Sub(*out.Since).Round(time.Millisecond).Seconds(), 0))
	}
	for _, r := range s.GetLaggingRanks() {
		out.LaggingRanks = append(out.LaggingRanks, StalledRankJSON{Rank: r.GetRank(), Node: r.GetNode(), PID: r.GetPid(),
			Op: r.GetOp().Short(), Seq: r.GetSeq(), InCall: r.GetInCall(), ProcState: optString(r.GetProcState())})
	}
	for _, r := range s.GetWaitingRanks() {
		out.WaitingRanks = append(out.WaitingRanks, r.GetRank())
	}
	return out
}

// SlowJSON is one fail-slow finding in `gpuctl stalls -o json`.
type SlowJSON struct {
	Job   string `json:"job"`
	Class string `json:"class"`
	// Rank is the slow rank (compute-slow), null otherwise; Node its
	// node, or the node a communication-slow finding names.
	Rank        *int32     `json:"rank"`
	Node        *string    `json:"node"`
	Comm        *int32     `json:"comm"`
	Since       *time.Time `json:"since_time"`
	SlowSeconds *float64   `json:"slow_seconds"`
	LateSeconds *float64   `json:"late_seconds"`
	Slowdown    float64    `json:"slowdown"`
	Evidence    string     `json:"evidence"`
	// Acked is an operator's acknowledgement (for the job's attempt);
	// SilencedUntil the end of a silence, null when none. Either keeps
	// the finding from automatic action and from alerting metrics.
	Acked         bool       `json:"acked"`
	SilencedUntil *time.Time `json:"silenced_until_time"`
}

// SlowFromAPI converts a finding to its JSON view; now gives its duration.
func SlowFromAPI(f *api.SlowFinding, now time.Time) SlowJSON {
	out := SlowJSON{Job: f.GetJob(), Class: f.GetClass(), Node: optString(f.GetNode()), Since: optTime(f.GetSinceUnixNano()),
		Slowdown: math.Round(f.GetSlowdown()*100) / 100, Evidence: f.GetEvidence(), Acked: f.GetAcked()}
	if until := f.GetSilencedUntilUnixNano(); until > now.UnixNano() {
		out.SilencedUntil = optTime(until)
	}
	if f.GetRank() >= 0 && f.GetClass() == "compute-slow" {
		out.Rank = ptr(f.GetRank())
	}
	if f.GetComm() >= 0 && f.GetClass() != "job-wide" {
		out.Comm = ptr(f.GetComm())
	}
	if out.Since != nil {
		out.SlowSeconds = ptr(max(now.Sub(*out.Since).Round(time.Millisecond).Seconds(), 0))
	}
	if f.GetLateNs() > 0 {
		out.LateSeconds = ptr(time.Duration(f.GetLateNs()).Round(time.Millisecond).Seconds())
	}
	return out
}

// Stalls writes the declared NCCL stalls.
func Stalls(w io.Writer, o Options, stalls []*api.Stall) error {
	return stallsAndSlow(w, o, &api.ListStallsResponse{Stalls: stalls}, false)
}

// Findings writes the declared NCCL stalls, then the fail-slow findings
// (as a second table, when there are any): `gpuctl stalls`.
func Findings(w io.Writer, o Options, r *api.ListStallsResponse) error {
	return stallsAndSlow(w, o, r, true)
}

func stallsAndSlow(w io.Writer, o Options, r *api.ListStallsResponse, withSlow bool) error {
	stalls := r.GetStalls()
	now := o.now()
	if o.Format == JSON {
		doc := struct {
			Stalls []StallJSON `json:"stalls"`
			Slow   []SlowJSON  `json:"slow,omitempty"`
		}{Stalls: []StallJSON{}}
		for _, s := range stalls {
			doc.Stalls = append(doc.Stalls, StallFromAPI(s, now))
		}
		if withSlow {
			doc.Slow = []SlowJSON{}
			for _, f := range r.GetSlow() {
				doc.Slow = append(doc.Slow, SlowFromAPI(f, now))
			}
			// An empty list, never null nor absent, for scripts.
			return writeJSON(w, struct {
				Stalls []StallJSON `json:"stalls"`
				Slow   []SlowJSON  `json:"slow"`
			}{doc.Stalls, doc.Slow})
		}
		return writeJSON(w, doc)
	}
	t := tableData{empty: "no stalls"}
	t.cols = []column{{name: "JOB"}, {name: "LAGGING"}, {name: "WAITING"}, {name: "FOR"}, {name: "DIAGNOSIS", flex: true}}
	if o.Format == Wide {
		t.cols = []column{{name: "JOB"}, {name: "COMM"}, {name: "LAGGING"}, {name: "WAITING"}, {name: "FOR"}, {name: "THRESHOLD"},
			{name: "SINCE"}, {name: "DIAGNOSIS", flex: true}}
	}
	for _, s := range stalls {
		v := StallFromAPI(s, now)
		lag := make([]string, len(v.LaggingRanks))
		for i, r := range v.LaggingRanks {
			lag[i] = fmt.Sprintf("%d@%s/%d", r.Rank, r.Node, r.PID)
		}
		wait := make([]string, len(v.WaitingRanks))
		for i, r := range v.WaitingRanks {
			wait[i] = strconv.Itoa(int(r))
		}
		since := timeOrZero(v.Since)
		forCell := num(age(now, since), deref0(v.StalledSeconds))
		if o.Format == Wide {
			t.add(txt(v.Job), txt(v.Comm), txt(dash(strings.Join(lag, ","))), txt(dash(strings.Join(wait, ","))), forCell,
				num((time.Duration(v.ThresholdSeconds*1e9)).String(), v.ThresholdSeconds),
				num(since.Format(time.RFC3339), float64(since.Unix())), txt(v.Diagnosis))
			continue
		}
		t.add(txt(v.Job), txt(dash(strings.Join(lag, ","))), txt(dash(strings.Join(wait, ","))), forCell, txt(v.Diagnosis))
	}
	if err := o.writeTable(w, t); err != nil || len(r.GetSlow()) == 0 {
		return err
	}
	if len(stalls) > 0 {
		fmt.Fprintln(w)
	}
	return o.writeTable(w, slowTable(o, r.GetSlow(), now))
}

// slowTable is the fail-slow findings as a table: who is slow, how, for
// how long, by how much, and the evidence.
func slowTable(o Options, slow []*api.SlowFinding, now time.Time) tableData {
	t := tableData{empty: "no slow ranks"}
	t.cols = []column{{name: "JOB"}, {name: "SLOW"}, {name: "WHO"}, {name: "FOR"}, {name: "SLOWDOWN"}, {name: "QUIET"}, {name: "EVIDENCE", flex: true}}
	if o.Format == Wide {
		t.cols = []column{{name: "JOB"}, {name: "SLOW"}, {name: "WHO"}, {name: "COMM"}, {name: "FOR"}, {name: "SLOWDOWN"}, {name: "LATE"},
			{name: "SINCE"}, {name: "QUIET"}, {name: "EVIDENCE", flex: true}}
	}
	for _, f := range slow {
		v := SlowFromAPI(f, now)
		who := "every rank"
		switch {
		case v.Rank != nil:
			who = fmt.Sprintf("rank %d@%s", *v.Rank, deref(v.Node))
		case v.Node != nil:
			who = *v.Node
		case v.Comm != nil:
			who = "-"
		}
		since := timeOrZero(v.Since)
		forCell := num(age(now, since), deref0(v.SlowSeconds))
		sd := num(fmt.Sprintf("%.2fx", v.Slowdown), v.Slowdown)
		quiet := "-"
		switch {
		case v.Acked:
			quiet = "acked"
		case v.SilencedUntil != nil:
			quiet = "silenced " + age(*v.SilencedUntil, now)
		}
		if o.Format == Wide {
			comm, late := "-", "-"
			if v.Comm != nil {
				comm = strconv.Itoa(int(*v.Comm))
			}
			if v.LateSeconds != nil {
				late = time.Duration(*v.LateSeconds * 1e9).String()
			}
			t.add(txt(v.Job), txt(v.Class), txt(who), txt(comm), forCell, sd, num(late, deref0(v.LateSeconds)),
				num(since.Format(time.RFC3339), float64(since.Unix())), txt(quiet), txt(v.Evidence))
			continue
		}
		t.add(txt(v.Job), txt(v.Class), txt(who), forCell, sd, txt(quiet), txt(v.Evidence))
	}
	return t
}
