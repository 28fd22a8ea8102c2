package views

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// StatusJSON is `gpuctl status -o json`: the control plane's servers and
// its store.
type StatusJSON struct {
	// Servers lists every server, the leader first.
	Servers []ServerJSON `json:"servers"`
	Store   StoreJSON    `json:"store"`
	// Leadership lists the leadership changes, newest first.
	Leadership []LeadershipJSON `json:"leadership"`
	// TelemetryShed is what the answering leader's ingest dropped to keep
	// up; null from a standby or an older server.
	TelemetryShed *TelemetryShedJSON `json:"telemetry_shed"`
	// ReadOnly is set while the answering server refuses every change
	// (its store is away); null otherwise.
	ReadOnly *ReadOnlyJSON `json:"read_only"`
}

// ReadOnlyJSON is why the control plane refuses changes, since when.
type ReadOnlyJSON struct {
	Since  *time.Time `json:"since_time"`
	Reason string     `json:"reason"`
}

// TelemetryShedJSON counts telemetry a server shed since it started.
type TelemetryShedJSON struct {
	Batches     uint64 `json:"batches"`
	GPUSamples  uint64 `json:"gpu_samples"`
	Collectives uint64 `json:"collectives"`
	// Pace is how many times less often than their own interval nodes
	// are asked to send telemetry now; 1 is their own pace.
	Pace uint32 `json:"pace"`
}

// ServerJSON is one gpuctl serve.
type ServerJSON struct {
	Name  string     `json:"name"`
	Addr  *string    `json:"address"`
	Role  string     `json:"role"`
	Since *time.Time `json:"since_time"`
	// Answered is true for the server that answered this request.
	Answered bool `json:"answered"`
}

// StoreJSON is the control plane's store.
type StoreJSON struct {
	Kind    string            `json:"kind"`
	Healthy bool              `json:"healthy"`
	Error   *string           `json:"error"`
	Members []StoreMemberJSON `json:"members"`
}

// StoreMemberJSON is one member of a replicated store.
type StoreMemberJSON struct {
	Name     string  `json:"name"`
	Endpoint string  `json:"endpoint"`
	Leader   bool    `json:"leader"`
	Healthy  bool    `json:"healthy"`
	Error    *string `json:"error"`
}

// LeadershipJSON is one leadership change.
type LeadershipJSON struct {
	Time    *time.Time `json:"time"`
	Server  *string    `json:"server"`
	Message string     `json:"message"`
}

// StatusFromAPI converts the server's answer.
func StatusFromAPI(r *api.StatusResponse) StatusJSON {
	out := StatusJSON{Servers: []ServerJSON{}, Leadership: []LeadershipJSON{},
		Store: StoreJSON{Kind: r.GetStore(), Healthy: r.GetStoreHealthy(), Error: optString(r.GetStoreError()), Members: []StoreMemberJSON{}}}
	for _, s := range r.GetServers() {
		out.Servers = append(out.Servers, ServerJSON{Name: s.GetName(), Addr: optString(s.GetAddr()), Role: s.GetRole(),
			Since: optTime(s.GetSinceUnixNano()), Answered: s.GetName() == r.GetSelf().GetName()})
	}
	for _, m := range r.GetStoreMembers() {
		out.Store.Members = append(out.Store.Members, StoreMemberJSON{Name: m.GetName(), Endpoint: m.GetEndpoint(),
			Leader: m.GetLeader(), Healthy: m.GetHealthy(), Error: optString(m.GetError())})
	}
	for _, e := range r.GetLeadership() {
		out.Leadership = append(out.Leadership, LeadershipJSON{Time: optTime(e.GetTimeUnixNano()),
			Server: optString(e.GetAttrs()["server"]), Message: e.GetMessage()})
	}
	if r.GetReadOnly() {
		out.ReadOnly = &ReadOnlyJSON{Since: optTime(r.GetReadOnlySinceUnixNano()), Reason: r.GetReadOnlyReason()}
	}
	if s := r.GetTelemetryShed(); s != nil {
		out.TelemetryShed = &TelemetryShedJSON{Batches: s.GetBatches(), GPUSamples: s.GetGpuSamples(), Collectives: s.GetCollectives(),
			Pace: max(s.GetPace(), 1)}
	}
	return out
}

// Status writes which server leads, since when, and the store's health:
// a table of servers, a line for the store and one per member, and the
// recent leadership changes.
func Status(w io.Writer, o Options, r *api.StatusResponse) error {
	st := StatusFromAPI(r)
	if o.Format == JSON {
		return writeJSON(w, st)
	}
	now := o.now()
	tb := tableData{empty: "no servers listed"}
	tb.cols = []column{{name: "SERVER"}, {name: "ROLE"}, {name: "SINCE"}, {name: "ADDRESS", flex: true}}
	for _, s := range st.Servers {
		name := s.Name
		if s.Answered {
			name += "*"
		}
		tb.add(txt(name), txt(s.Role), txt(ageOf(now, s.Since)), txt(dash(deref(s.Addr))))
	}
	if err := o.writeTable(w, tb); err != nil {
		return err
	}
	health := "healthy"
	if !st.Store.Healthy {
		health = "UNHEALTHY: " + deref(st.Store.Error)
	}
	if _, err := fmt.Fprintf(w, "\n%s\n", api.EscapeText(fmt.Sprintf("store %s: %s", st.Store.Kind, health))); err != nil {
		return err
	}
	for _, m := range st.Store.Members {
		line := fmt.Sprintf("  %s %s", m.Name, m.Endpoint)
		if m.Leader {
			line += " (raft leader)"
		}
		if !m.Healthy {
			line += " UNREACHABLE: " + deref(m.Error)
		}
		if _, err := fmt.Fprintln(w, api.EscapeText(line)); err != nil {
			return err
		}
	}
	if ro := st.ReadOnly; ro != nil {
		// Changes are refused meanwhile; running jobs go on. The reason
		// is long (it names the store and since when): wrapped.
		if _, err := fmt.Fprintf(w, "READ-ONLY for %s: changes are refused; running jobs go on\n", ageOf(now, ro.Since)); err != nil {
			return err
		}
		for _, line := range wrapWords(api.EscapeText(ro.Reason), o.width()-2) {
			if _, err := fmt.Fprintln(w, "  "+line); err != nil {
				return err
			}
		}
	}
	if s := st.TelemetryShed; s != nil && (s.Batches > 0 || s.GPUSamples > 0) {
		// The server kept its nodes up by dropping their figures.
		if _, err := fmt.Fprintf(w, "telemetry shed: %d GPU samples, %d batches (%d NCCL calls)\n",
			s.GPUSamples, s.Batches, s.Collectives); err != nil {
			return err
		}
	}
	if s := st.TelemetryShed; s != nil && s.Pace > 1 {
		// Overloaded now: the nodes were asked to send less often.
		if _, err := fmt.Fprintf(w, "telemetry paced: nodes send %d times less often while ingest is behind\n", s.Pace); err != nil {
			return err
		}
	}
	if len(st.Leadership) > 0 {
		fmt.Fprintln(w, "\nleadership:")
		for _, l := range st.Leadership {
			if _, err := fmt.Fprintln(w, api.EscapeText(fmt.Sprintf("  %-6s ago  %s", ageOf(now, l.Time), l.Message))); err != nil {
				return err
			}
		}
	}
	return nil
}

// wrapWords breaks s into lines of at most width runes at spaces (a word
// longer than width gets a line of its own).
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len([]rune(line))+1+len([]rune(w)) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}
