package views

import (
	"fmt"
	"io"
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

// Stalls writes the declared NCCL stalls.
func Stalls(w io.Writer, o Options, stalls []*api.Stall) error {
	now := o.now()
	if o.Format == JSON {
		doc := struct {
			Stalls []StallJSON `json:"stalls"`
		}{Stalls: []StallJSON{}}
		for _, s := range stalls {
			doc.Stalls = append(doc.Stalls, StallFromAPI(s, now))
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
	return o.writeTable(w, t)
}
