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
	Name            string            `json:"name"`
	State           string            `json:"state"`
	Connected       bool              `json:"connected"`
	LastSeen        time.Time         `json:"last_seen"`
	Address         string            `json:"address,omitempty"`
	Labels          map[string]string `json:"labels,omitempty"`
	SimProfile      string            `json:"sim_profile,omitempty"`
	CordonReason    string            `json:"cordon_reason,omitempty"`
	LostCollectives uint64            `json:"lost_collectives"`
	LostNetEvents   uint64            `json:"lost_net_events"`
	DroppedBatches  uint64            `json:"dropped_batches"`
	GPUs            []GPUJSON         `json:"gpus"`
}

// GPUJSON is one GPU in `gpuctl nodes` and `gpuctl gpus` JSON.
type GPUJSON struct {
	Node            string     `json:"node,omitempty"`
	Index           uint32     `json:"index"`
	UUID            string     `json:"uuid"`
	Model           string     `json:"model"`
	PCIBusID        string     `json:"pci_bus_id,omitempty"`
	Healthy         bool       `json:"healthy"`
	UnhealthyReason string     `json:"unhealthy_reason,omitempty"`
	SampledAt       time.Time  `json:"sampled_at"`
	UtilPercent     uint32     `json:"util_percent"`
	MemUtilPercent  uint32     `json:"mem_util_percent"`
	MemUsedBytes    uint64     `json:"mem_used_bytes"`
	MemTotalBytes   uint64     `json:"mem_total_bytes"`
	TempC           uint32     `json:"temp_c"`
	PowerW          float64    `json:"power_w"`
	EnergyJ         float64    `json:"energy_j"`
	SMClockMHz      uint32     `json:"sm_clock_mhz"`
	MemClockMHz     uint32     `json:"mem_clock_mhz"`
	Throttle        []string   `json:"throttle"`
	ECCCorrected    uint64     `json:"ecc_corrected"`
	ECCUncorrected  uint64     `json:"ecc_uncorrected"`
	RetiredPages    uint32     `json:"retired_pages"`
	NVLinkTxBps     uint64     `json:"nvlink_tx_bytes_per_sec"`
	NVLinkRxBps     uint64     `json:"nvlink_rx_bytes_per_sec"`
	PCIeTxBps       uint64     `json:"pcie_tx_bytes_per_sec"`
	PCIeRxBps       uint64     `json:"pcie_rx_bytes_per_sec"`
	Processes       []ProcJSON `json:"processes"`
	Lost            bool       `json:"lost"`
}

// ProcJSON is a process holding GPU memory.
type ProcJSON struct {
	PID          uint32 `json:"pid"`
	Name         string `json:"name,omitempty"`
	UsedMemBytes uint64 `json:"used_mem_bytes"`
}

// NodeFromAPI converts a node status to its JSON view.
func NodeFromAPI(n *api.NodeStatus) NodeJSON {
	reg := n.GetRegistration()
	out := NodeJSON{
		Name: reg.GetName(), State: n.GetState().Short(), Connected: n.GetConnected(),
		LastSeen: timeOf(n.GetLastSeenUnixNano()), Address: n.GetRemoteAddr(), Labels: reg.GetLabels(),
		SimProfile: reg.GetSimProfile(), CordonReason: n.GetCordonReason(),
		LostCollectives: n.GetLostCollectives(), LostNetEvents: n.GetLostNetEvents(), DroppedBatches: n.GetDroppedBatches(),
		GPUs: []GPUJSON{},
	}
	for _, g := range n.GetGpus() {
		out.GPUs = append(out.GPUs, GPUFromAPI("", g))
	}
	return out
}

// GPUFromAPI converts one GPU's status; node is set for flat GPU lists.
func GPUFromAPI(node string, g *api.GPUStatus) GPUJSON {
	info, s := g.GetInfo(), g.GetLast()
	out := GPUJSON{
		Node: node, Index: info.GetIndex(), UUID: info.GetUuid(), Model: info.GetModel(), PCIBusID: info.GetPciBusId(),
		Healthy: g.GetHealthy(), UnhealthyReason: g.GetUnhealthyReason(), MemTotalBytes: info.GetMemTotalBytes(),
		Throttle: []string{}, Processes: []ProcJSON{},
	}
	if s == nil {
		return out
	}
	out.SampledAt = timeOf(s.GetTimeUnixNano())
	out.UtilPercent, out.MemUtilPercent = s.GetUtilGpuPercent(), s.GetUtilMemPercent()
	out.MemUsedBytes = s.GetMemUsedBytes()
	if s.GetMemTotalBytes() != 0 {
		out.MemTotalBytes = s.GetMemTotalBytes()
	}
	out.TempC = s.GetTempC()
	out.PowerW = float64(s.GetPowerMw()) / 1000
	out.EnergyJ = float64(s.GetEnergyMj()) / 1000
	out.SMClockMHz, out.MemClockMHz = s.GetSmClockMhz(), s.GetMemClockMhz()
	out.Throttle = append(out.Throttle, s.GetThrottleNames()...)
	out.ECCCorrected = s.GetEcc().GetVolatileCorrected()
	out.ECCUncorrected = s.GetEcc().GetVolatileUncorrected()
	out.RetiredPages = s.GetRetiredPagesSbe() + s.GetRetiredPagesDbe()
	out.NVLinkTxBps, out.NVLinkRxBps = s.GetNvlinkTxBytesPerSec(), s.GetNvlinkRxBytesPerSec()
	out.PCIeTxBps, out.PCIeRxBps = s.GetPcieTxBytesPerSec(), s.GetPcieRxBytesPerSec()
	for _, p := range s.GetProcesses() {
		out.Processes = append(out.Processes, ProcJSON{PID: p.GetPid(), Name: p.GetName(), UsedMemBytes: p.GetUsedMemBytes()})
	}
	out.Lost = s.GetLost()
	return out
}

// Nodes writes the node list in format f; now is used for ages in tables.
func Nodes(w io.Writer, f Format, nodes []*api.NodeStatus, now time.Time) error {
	if f == JSON {
		doc := struct {
			Nodes []NodeJSON `json:"nodes"`
		}{Nodes: []NodeJSON{}}
		for _, n := range nodes {
			doc.Nodes = append(doc.Nodes, NodeFromAPI(n))
		}
		return writeJSON(w, doc)
	}
	header := []string{"NAME", "STATE", "GPUS", "HEALTHY", "UTIL", "MEM", "POWER", "MAX TEMP", "LAST SEEN"}
	if f == Wide {
		header = append(header, "MODEL", "ADDRESS", "LABELS", "LOST")
	}
	var rows [][]string
	for _, n := range nodes {
		v := NodeFromAPI(n)
		var util, healthy uint32
		var used, total uint64
		var power float64
		var maxTemp uint32
		models := map[string]bool{}
		for _, g := range v.GPUs {
			util += g.UtilPercent
			used += g.MemUsedBytes
			total += g.MemTotalBytes
			power += g.PowerW
			maxTemp = max(maxTemp, g.TempC)
			if g.Healthy {
				healthy++
			}
			models[g.Model] = true
		}
		avg := "-"
		if len(v.GPUs) > 0 {
			avg = fmt.Sprintf("%d%%", util/uint32(len(v.GPUs)))
		}
		state := v.State
		if v.CordonReason != "" {
			state += " (" + v.CordonReason + ")"
		}
		row := []string{v.Name, state, strconv.Itoa(len(v.GPUs)), fmt.Sprintf("%d/%d", healthy, len(v.GPUs)), avg,
			Bytes(used) + "/" + Bytes(total), fmt.Sprintf("%.0fW", power), fmt.Sprintf("%dC", maxTemp), age(now, v.LastSeen)}
		if f == Wide {
			row = append(row, strings.Join(keys(models), ","), v.Address, labels(v.Labels),
				fmt.Sprintf("%d/%d/%d", v.LostCollectives, v.LostNetEvents, v.DroppedBatches))
		}
		rows = append(rows, row)
	}
	return table(w, header, rows)
}

// GPUs writes a flat list of every GPU of the given nodes.
func GPUs(w io.Writer, f Format, nodes []*api.NodeStatus) error {
	var gpus []GPUJSON
	for _, n := range nodes {
		for _, g := range n.GetGpus() {
			gpus = append(gpus, GPUFromAPI(n.GetRegistration().GetName(), g))
		}
	}
	if f == JSON {
		if gpus == nil {
			gpus = []GPUJSON{}
		}
		return writeJSON(w, struct {
			GPUs []GPUJSON `json:"gpus"`
		}{gpus})
	}
	header := []string{"NODE", "GPU", "MODEL", "UTIL", "MEM", "TEMP", "POWER", "SM MHZ", "HEALTH", "PROCS"}
	if f == Wide {
		header = append(header, "UUID", "THROTTLE", "ECC C/U", "NVLINK TX/RX", "PCIE TX/RX")
	}
	var rows [][]string
	for _, g := range gpus {
		health := "ok"
		switch {
		case g.Lost:
			health = "lost"
		case !g.Healthy:
			health = "unhealthy: " + g.UnhealthyReason
		}
		row := []string{g.Node, strconv.Itoa(int(g.Index)), g.Model, fmt.Sprintf("%d%%", g.UtilPercent),
			Bytes(g.MemUsedBytes) + "/" + Bytes(g.MemTotalBytes), fmt.Sprintf("%dC", g.TempC), fmt.Sprintf("%.0fW", g.PowerW),
			strconv.Itoa(int(g.SMClockMHz)), health, strconv.Itoa(len(g.Processes))}
		if f == Wide {
			thr := strings.Join(g.Throttle, ",")
			if thr == "" {
				thr = "-"
			}
			row = append(row, g.UUID, thr, fmt.Sprintf("%d/%d", g.ECCCorrected, g.ECCUncorrected),
				Bytes(g.NVLinkTxBps)+"/s "+Bytes(g.NVLinkRxBps)+"/s", Bytes(g.PCIeTxBps)+"/s "+Bytes(g.PCIeRxBps)+"/s")
		}
		rows = append(rows, row)
	}
	return table(w, header, rows)
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
