package views

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// NodeJSON is one node in `gpuctl nodes -o json`.
type NodeJSON struct {
	Name string `json:"name"`
	// State is the node's liveness, ready or down; whether it takes new
	// work is Cordoned and Draining.
	State           string            `json:"state"`
	Cordoned        bool              `json:"cordoned"`
	Draining        bool              `json:"draining"`
	CordonReason    *string           `json:"cordon_reason"`
	DownReason      *string           `json:"down_reason"`
	SuspectUntil    *time.Time        `json:"suspect_until_time"`
	SuspectReason   *string           `json:"suspect_reason"`
	LostTimes       []time.Time       `json:"lost_times"`
	Stale           bool              `json:"stale"`
	StateSince      *time.Time        `json:"state_since_time"`
	Connected       bool              `json:"connected"`
	LastSeen        *time.Time        `json:"last_seen_time"`
	Address         *string           `json:"address"`
	Hostname        *string           `json:"hostname"`
	Labels          map[string]string `json:"labels"`
	SimProfile      *string           `json:"sim_profile"`
	AgentVersion    *string           `json:"agent_version"`
	DriverVersion   *string           `json:"driver_version"`
	CUDAVersion     *string           `json:"cuda_version"`
	HeartbeatSecs   *float64          `json:"heartbeat_interval_seconds"`
	LostCollectives uint64            `json:"lost_collectives"`
	LostNetEvents   uint64            `json:"lost_net_events"`
	DroppedBatches  uint64            `json:"dropped_batches"`
	GPUs            []GPUJSON         `json:"gpus"`
}

// GPUJSON is one GPU in `gpuctl gpus -o json` and in each node of
// `gpuctl nodes -o json`. The sampled figures are null until the GPU has
// been sampled; while its node is down (stale) they are the last ones
// the node sent.
type GPUJSON struct {
	Node            string     `json:"node"`
	Index           uint32     `json:"index"`
	UUID            string     `json:"uuid"`
	Model           string     `json:"model"`
	PCIBusID        *string    `json:"pci_bus_id"`
	Healthy         bool       `json:"healthy"`
	UnhealthyReason *string    `json:"unhealthy_reason"`
	Lost            bool       `json:"lost"`
	Stale           bool       `json:"stale"`
	SampleTime      *time.Time `json:"sample_time"`
	UtilPercent     *uint32    `json:"util_percent"`
	MemUtilPercent  *uint32    `json:"mem_util_percent"`
	MemUsedBytes    *uint64    `json:"mem_used_bytes"`
	MemTotalBytes   uint64     `json:"mem_total_bytes"`
	TempCelsius     *uint32    `json:"temperature_celsius"`
	PowerWatts      *float64   `json:"power_watts"`
	PowerLimitWatts *float64   `json:"power_limit_watts"`
	EnergyJoules    *float64   `json:"energy_joules"`
	SMClockMHz      *uint32    `json:"sm_clock_mhz"`
	MemClockMHz     *uint32    `json:"mem_clock_mhz"`
	Throttle        []string   `json:"throttle_reasons"`
	ECCCorrected    *uint64    `json:"ecc_corrected"`
	ECCUncorrected  *uint64    `json:"ecc_uncorrected"`
	RetiredPages    *uint32    `json:"retired_pages"`
	RemappedCorr    *uint32    `json:"remapped_rows_correctable"`
	RemappedUncorr  *uint32    `json:"remapped_rows_uncorrectable"`
	RemapPending    bool       `json:"remap_pending"`
	RemapFailure    bool       `json:"remap_failure"`
	NVLinkTx        *uint64    `json:"nvlink_tx_bytes_per_second"`
	NVLinkRx        *uint64    `json:"nvlink_rx_bytes_per_second"`
	PCIeTx          *uint64    `json:"pcie_tx_bytes_per_second"`
	PCIeRx          *uint64    `json:"pcie_rx_bytes_per_second"`
	Processes       []ProcJSON `json:"processes"`
}

// ProcJSON is a process holding GPU memory.
type ProcJSON struct {
	PID          uint32  `json:"pid"`
	Name         *string `json:"name"`
	MemUsedBytes uint64  `json:"mem_used_bytes"`
}

// NodeLiveness is a node's liveness (ready or down) and whether it takes
// new work, from protocol v1.1's fields, or from the states a server of
// v1.0 reports (cordoned, draining).
func NodeLiveness(n *api.NodeStatus) (state string, cordoned, draining bool) {
	cordoned, draining = n.GetCordoned(), n.GetDraining()
	switch n.GetState() {
	case api.NodeState_NODE_STATE_DOWN:
		return "down", cordoned || draining, draining
	case api.NodeState_NODE_STATE_CORDONED:
		return "ready", true, draining
	case api.NodeState_NODE_STATE_DRAINING:
		return "ready", true, true
	case api.NodeState_NODE_STATE_READY:
		return "ready", cordoned || draining, draining
	}
	return "unknown", cordoned || draining, draining
}

// NodeStateText is a node's STATE as tables show it, after kubectl's
// Ready,SchedulingDisabled: ready, ready,cordoned, down,draining, …
func NodeStateText(n *api.NodeStatus) string {
	state, cordoned, draining := NodeLiveness(n)
	switch {
	case draining:
		return state + ",draining"
	case cordoned:
		return state + ",cordoned"
	}
	return state
}

// NodeFromAPI converts a node status to its JSON view.
func NodeFromAPI(n *api.NodeStatus) NodeJSON {
	reg := n.GetRegistration()
	state, cordoned, draining := NodeLiveness(n)
	out := NodeJSON{
		Name: reg.GetName(), State: state, Cordoned: cordoned, Draining: draining,
		CordonReason: optString(n.GetCordonReason()), DownReason: optString(n.GetDownReason()), Stale: n.GetStale(),
		StateSince: optTime(n.GetStateSinceUnixNano()), Connected: n.GetConnected(), LastSeen: optTime(n.GetLastSeenUnixNano()),
		Address: optString(n.GetRemoteAddr()), Hostname: optString(reg.GetHostname()), Labels: mapOrEmpty(reg.GetLabels()),
		SimProfile: optString(reg.GetSimProfile()), AgentVersion: optString(reg.GetAgentVersion()),
		DriverVersion: optString(reg.GetDriverVersion()), CUDAVersion: optString(reg.GetCudaVersion()),
		LostCollectives: n.GetLostCollectives(), LostNetEvents: n.GetLostNetEvents(), DroppedBatches: n.GetDroppedBatches(),
		GPUs: []GPUJSON{}, SuspectUntil: optTime(n.GetSuspectUntilUnixNano()), SuspectReason: optString(n.GetSuspectReason()),
		LostTimes: []time.Time{},
	}
	for _, ns := range n.GetLostUnixNano() {
		out.LostTimes = append(out.LostTimes, time.Unix(0, ns).UTC())
	}
	if ms := reg.GetHeartbeatIntervalMs(); ms > 0 {
		out.HeartbeatSecs = ptr(float64(ms) / 1000)
	}
	for _, g := range n.GetGpus() {
		out.GPUs = append(out.GPUs, GPUFromAPI(out.Name, n.GetStale(), g))
	}
	return out
}

// GPUFromAPI converts one GPU's status; stale says its node is down.
func GPUFromAPI(node string, stale bool, g *api.GPUStatus) GPUJSON {
	info, s := g.GetInfo(), g.GetLast()
	out := GPUJSON{
		Node: node, Index: info.GetIndex(), UUID: info.GetUuid(), Model: info.GetModel(), PCIBusID: optString(info.GetPciBusId()),
		Healthy: g.GetHealthy(), UnhealthyReason: optString(g.GetUnhealthyReason()), Stale: stale,
		MemTotalBytes: info.GetMemTotalBytes(), Throttle: []string{}, Processes: []ProcJSON{},
	}
	if mw := info.GetPowerLimitMw(); mw > 0 {
		out.PowerLimitWatts = ptr(float64(mw) / 1000)
	}
	if s == nil {
		return out
	}
	out.Lost = s.GetLost()
	out.SampleTime = optTime(s.GetTimeUnixNano())
	out.UtilPercent, out.MemUtilPercent = ptr(s.GetUtilGpuPercent()), ptr(s.GetUtilMemPercent())
	out.MemUsedBytes = ptr(s.GetMemUsedBytes())
	if s.GetMemTotalBytes() != 0 {
		out.MemTotalBytes = s.GetMemTotalBytes()
	}
	out.TempCelsius = ptr(s.GetTempC())
	out.PowerWatts = ptr(float64(s.GetPowerMw()) / 1000)
	out.EnergyJoules = ptr(float64(s.GetEnergyMj()) / 1000)
	out.SMClockMHz, out.MemClockMHz = ptr(s.GetSmClockMhz()), ptr(s.GetMemClockMhz())
	out.Throttle = append(out.Throttle, s.GetThrottleNames()...)
	out.ECCCorrected = ptr(s.GetEcc().GetVolatileCorrected())
	out.ECCUncorrected = ptr(s.GetEcc().GetVolatileUncorrected())
	out.RetiredPages = ptr(s.GetRetiredPagesSbe() + s.GetRetiredPagesDbe())
	out.RemappedCorr, out.RemappedUncorr = ptr(s.GetRemappedRowsCorrectable()), ptr(s.GetRemappedRowsUncorrectable())
	out.RemapPending, out.RemapFailure = s.GetRemapPending(), s.GetRemapFailure()
	out.NVLinkTx, out.NVLinkRx = ptr(s.GetNvlinkTxBytesPerSec()), ptr(s.GetNvlinkRxBytesPerSec())
	out.PCIeTx, out.PCIeRx = ptr(s.GetPcieTxBytesPerSec()), ptr(s.GetPcieRxBytesPerSec())
	for _, p := range s.GetProcesses() {
		out.Processes = append(out.Processes, ProcJSON{PID: p.GetPid(), Name: optString(p.GetName()), MemUsedBytes: p.GetUsedMemBytes()})
	}
	return out
}

// staleText marks a figure a down node sent before it went away: it is
// shown in parentheses, as not live.
func staleText(stale bool, s string) string {
	if stale && s != "-" {
		return "(" + s + ")"
	}
	return s
}

// Suspect says, at now, until when a node is suspect and how often it
// was lost ("" when it is not).
func (v NodeJSON) Suspect(now time.Time) string {
	if v.SuspectUntil == nil || !v.SuspectUntil.After(now) {
		return ""
	}
	return fmt.Sprintf("suspect until %s (lost %d× within the window)", v.SuspectUntil.UTC().Format("15:04:05"), len(v.LostTimes))
}

// nodeReason is the REASON column: why a node is down, why it is
// cordoned, and until when it is suspect.
func nodeReason(v NodeJSON, now time.Time) string {
	var parts []string
	if v.State == "down" {
		if v.DownReason != nil {
			parts = append(parts, "down: "+*v.DownReason)
		} else {
			parts = append(parts, "down")
		}
	}
	if v.CordonReason != nil {
		parts = append(parts, *v.CordonReason)
	} else if v.Cordoned {
		parts = append(parts, "cordoned")
	}
	if s := v.Suspect(now); s != "" {
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, "; ")
}

// Nodes writes the node list.
func Nodes(w io.Writer, o Options, nodes []*api.NodeStatus) error {
	if o.Format == JSON {
		doc := struct {
			Nodes []NodeJSON `json:"nodes"`
		}{Nodes: []NodeJSON{}}
		for _, n := range nodes {
			doc.Nodes = append(doc.Nodes, NodeFromAPI(n))
		}
		return writeJSON(w, doc)
	}
	now := o.now()
	wide := o.Format == Wide
	t := tableData{empty: "no nodes: none has joined (start nodemon with a token from `gpuctl token create`)"}
	t.cols = []column{{name: "NAME"}, {name: "STATE"}, {name: "GPUS"}, {name: "UTIL"}, {name: "MEM"}, {name: "TEMP"}}
	if wide {
		t.cols = append(t.cols, column{name: "POWER"})
	}
	t.cols = append(t.cols, column{name: "SEEN"})
	if wide {
		t.cols = append(t.cols, column{name: "SINCE"}, column{name: "MODEL"}, column{name: "ADDRESS"}, column{name: "LABELS"}, column{name: "LOST"})
	}
	t.cols = append(t.cols, column{name: "REASON", flex: true})
	for _, n := range nodes {
		v := NodeFromAPI(n)
		var util, healthy, sampled uint32
		var used, total uint64
		var power float64
		var maxTemp uint32
		models := map[string]bool{}
		for _, g := range v.GPUs {
			if g.UtilPercent != nil {
				sampled++
				util += *g.UtilPercent
				used += *g.MemUsedBytes
				power += *g.PowerWatts
				maxTemp = max(maxTemp, *g.TempCelsius)
			}
			total += g.MemTotalBytes
			if g.Healthy {
				healthy++
			}
			models[g.Model] = true
		}
		avg, mem, pw, temp := cell{text: "-"}, cell{text: "-"}, cell{text: "-"}, cell{text: "-"}
		if sampled > 0 {
			a := util / sampled
			avg = num(staleText(v.Stale, fmt.Sprintf("%d%%", a)), float64(a))
			memText := gib(used) + "/" + gib(total)
			if wide {
				memText = Bytes(used) + "/" + Bytes(total)
			}
			mem = num(staleText(v.Stale, memText), float64(used))
			pw = num(staleText(v.Stale, fmt.Sprintf("%.0fW", power)), power)
			temp = num(staleText(v.Stale, fmt.Sprintf("%dC", maxTemp)), float64(maxTemp))
		}
		last := timeOrZero(v.LastSeen)
		// GPUS is healthy/total, as kubectl's READY is ready/total.
		row := []cell{txt(v.Name), txt(NodeStateText(n)), num(fmt.Sprintf("%d/%d", healthy, len(v.GPUs)), float64(healthy)), avg, mem, temp}
		if wide {
			row = append(row, pw)
		}
		row = append(row, num(age(now, last), now.Sub(last).Seconds()))
		if wide {
			since := timeOrZero(v.StateSince)
			row = append(row, num(age(now, since), now.Sub(since).Seconds()), txt(strings.Join(keys(models), ",")),
				txt(dash(deref(v.Address))), txt(labels(v.Labels)),
				txt(fmt.Sprintf("%d/%d/%d", v.LostCollectives, v.LostNetEvents, v.DroppedBatches)))
		}
		t.add(append(row, txt(nodeReason(v, now)))...)
	}
	return o.writeTable(w, t)
}

// gib renders a size in whole GiB (one decimal under 10), for narrow
// columns.
func gib(b uint64) string {
	g := float64(b) / (1 << 30)
	if g < 10 {
		return strconv.FormatFloat(g, 'f', 1, 64) + "G"
	}
	return strconv.FormatFloat(g, 'f', 0, 64) + "G"
}

// shortModel drops the vendor from a GPU's model name for narrow tables:
// NVIDIA H100 80GB HBM3 becomes H100 80GB HBM3.
func shortModel(m string) string { return strings.TrimPrefix(m, "NVIDIA ") }

// GPUs writes a flat list of every GPU of the given nodes.
func GPUs(w io.Writer, o Options, nodes []*api.NodeStatus) error {
	gpus := []GPUJSON{}
	for _, n := range nodes {
		for _, g := range n.GetGpus() {
			gpus = append(gpus, GPUFromAPI(n.GetRegistration().GetName(), n.GetStale(), g))
		}
	}
	if o.Format == JSON {
		return writeJSON(w, struct {
			GPUs []GPUJSON `json:"gpus"`
		}{gpus})
	}
	wide := o.Format == Wide
	t := tableData{empty: "no GPUs: no node has reported any"}
	t.cols = []column{{name: "NODE"}, {name: "GPU"}, {name: "MODEL"}, {name: "UTIL"}, {name: "MEM"}, {name: "TEMP"}, {name: "POWER"}}
	if wide {
		t.cols = append(t.cols, column{name: "SM MHZ"}, column{name: "PROCS"}, column{name: "UUID"}, column{name: "THROTTLE"},
			column{name: "ECC C/U"}, column{name: "NVLINK TX/RX"}, column{name: "PCIE TX/RX"})
	}
	t.cols = append(t.cols, column{name: "HEALTH", flex: true})
	for _, g := range gpus {
		health := "ok"
		switch {
		case g.Lost:
			health = "lost"
		case !g.Healthy:
			health = "unhealthy: " + dash(deref(g.UnhealthyReason))
		}
		model, memText := shortModel(g.Model), "-/"+gib(g.MemTotalBytes)
		if wide {
			model, memText = g.Model, "-/"+Bytes(g.MemTotalBytes)
		}
		row := []cell{txt(g.Node), count(g.Index), txt(model)}
		if g.UtilPercent == nil {
			row = append(row, txt("-"), txt(memText), txt("-"), txt("-"))
		} else {
			memText = gib(*g.MemUsedBytes) + "/" + gib(g.MemTotalBytes)
			if wide {
				memText = Bytes(*g.MemUsedBytes) + "/" + Bytes(g.MemTotalBytes)
			}
			row = append(row, num(staleText(g.Stale, fmt.Sprintf("%d%%", *g.UtilPercent)), float64(*g.UtilPercent)),
				num(staleText(g.Stale, memText), float64(*g.MemUsedBytes)),
				num(staleText(g.Stale, fmt.Sprintf("%dC", *g.TempCelsius)), float64(*g.TempCelsius)),
				num(staleText(g.Stale, fmt.Sprintf("%.0fW", *g.PowerWatts)), *g.PowerWatts))
		}
		if wide {
			thr := strings.Join(g.Throttle, ",")
			sm, ecc, nvl, pcie := txt("-"), "-", "-", "-"
			if g.ECCCorrected != nil {
				sm = count(*g.SMClockMHz)
				ecc = fmt.Sprintf("%d/%d", *g.ECCCorrected, *g.ECCUncorrected)
				nvl = Bytes(*g.NVLinkTx) + "/s " + Bytes(*g.NVLinkRx) + "/s"
				pcie = Bytes(*g.PCIeTx) + "/s " + Bytes(*g.PCIeRx) + "/s"
			}
			row = append(row, sm, count(len(g.Processes)), txt(g.UUID), txt(dash(thr)), txt(ecc), txt(nvl), txt(pcie))
		}
		t.add(append(row, txt(health))...)
	}
	return o.writeTable(w, t)
}

func timeOrZero(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func labels(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(m))
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// DrainedJobJSON is a job a drain found on the node: whether it moves,
// where to, or why it stays.
type DrainedJobJSON struct {
	Job    string   `json:"job"`
	Moving bool     `json:"moving"`
	To     []string `json:"to"`
	Reason *string  `json:"reason"`
}

// NodeAction writes what `gpuctl cordon|uncordon|drain -o json` did: the
// node as it now stands and, for a drain, its jobs.
func NodeAction(w io.Writer, r *api.CordonResponse) error {
	doc := struct {
		Nodes       []NodeJSON       `json:"nodes"`
		DrainedJobs []DrainedJobJSON `json:"drained_jobs"`
	}{Nodes: []NodeJSON{NodeFromAPI(r.GetNode())}, DrainedJobs: []DrainedJobJSON{}}
	for _, j := range r.GetJobs() {
		doc.DrainedJobs = append(doc.DrainedJobs, DrainedJobJSON{Job: j.GetJob(), Moving: j.GetMoving(), To: orEmpty(j.GetTo()),
			Reason: optString(j.GetReason())})
	}
	return writeJSON(w, doc)
}

// UnknownNames is the error for names that match nothing: it says which
// exist, so a typo is never an empty table.
func UnknownNames(kind string, missing, known []string, hint string) error {
	list := HostList(known)
	if len(known) == 0 {
		list = "none"
	}
	s := "s"
	if len(missing) == 1 {
		s = ""
	}
	return fmt.Errorf("no %s%s named %s: known %ss are %s (%s)", kind, s, strings.Join(Quoted(missing), ", "), kind, list, hint)
}

// SelectNodes keeps the named nodes, in the order named; none named keeps
// all.
func SelectNodes(nodes []*api.NodeStatus, names []string) ([]*api.NodeStatus, error) {
	if len(names) == 0 {
		return nodes, nil
	}
	byName := map[string]*api.NodeStatus{}
	var known []string
	for _, n := range nodes {
		byName[n.GetRegistration().GetName()] = n
		known = append(known, n.GetRegistration().GetName())
	}
	sort.Strings(known)
	var out []*api.NodeStatus
	var missing []string
	for _, name := range names {
		if n, ok := byName[name]; ok {
			out = append(out, n)
		} else {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		return nil, UnknownNames("node", missing, known, "`gpuctl nodes` lists them")
	}
	return out, nil
}

// NodeActionText says in sentences what a cordon, uncordon or drain did
// (NodeAction is its -o json).
func NodeActionText(w io.Writer, action string, r *api.CordonResponse) error {
	n := r.GetNode()
	line := n.GetRegistration().GetName() + " " + NodeStateText(n)
	if reason := n.GetCordonReason(); reason != "" {
		line += " (" + api.EscapeText(reason) + ")"
	}
	if state, _, _ := NodeLiveness(n); action == "uncordon" && state == "down" {
		line += ": takes new work once it reconnects"
	}
	if _, err := fmt.Fprintln(w, line); err != nil {
		return err
	}
	if action != "drain" {
		return nil
	}
	if len(r.GetJobs()) == 0 {
		_, err := fmt.Fprintln(w, "  no jobs run there")
		return err
	}
	for _, j := range r.GetJobs() {
		what := "stays: " + api.EscapeText(j.GetReason())
		if j.GetMoving() {
			what = "moving to " + strings.Join(j.GetTo(), ",") + " (checkpoint, stop, relaunch)"
		}
		if _, err := fmt.Fprintf(w, "  %s  %s\n", j.GetJob(), what); err != nil {
			return err
		}
	}
	return nil
}
