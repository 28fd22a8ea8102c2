package app

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/views"
)

// NodeBadge is a node's state as the console shows it at now: down wins
// over draining, which wins over cordoned, then suspect (lost by a
// recovery, no queued work until then); a ready node with a faulty GPU is
// "faulty".
func NodeBadge(n *api.NodeStatus, now time.Time) string {
	switch {
	case n.GetState() == api.NodeState_NODE_STATE_DOWN:
		return "down"
	case Draining(n):
		return "draining"
	case Cordoned(n):
		return "cordoned"
	case Suspect(n, now):
		return "suspect"
	}
	for _, g := range n.GetGpus() {
		if GPUFaulty(g) {
			return "faulty"
		}
	}
	return "ready"
}

// Cordoned reports whether a node takes no new work (draining included).
// Servers before protocol v1.1 said so in the node state itself.
func Cordoned(n *api.NodeStatus) bool {
	return n.GetCordoned() || n.GetDraining() || n.GetState() == api.NodeState_NODE_STATE_CORDONED ||
		n.GetState() == api.NodeState_NODE_STATE_DRAINING
}

// Suspect reports whether a node is suspect at now: a recovery lost it,
// and it takes no queued work until its suspicion ends or a validation
// gang passes there.
func Suspect(n *api.NodeStatus, now time.Time) bool {
	return n.GetSuspectUntilUnixNano() > now.UnixNano()
}

// Draining reports whether a node's jobs are being moved elsewhere.
func Draining(n *api.NodeStatus) bool {
	return n.GetDraining() || n.GetState() == api.NodeState_NODE_STATE_DRAINING
}

// NodeName is a node's name.
func NodeName(n *api.NodeStatus) string { return n.GetRegistration().GetName() }

// Simulated reports whether the node's GPUs are simulated, so faults can
// be injected.
func Simulated(n *api.NodeStatus) bool { return n.GetRegistration().GetSimProfile() != "" }

// Age renders how long ago unixNano was, "-" when never.
func Age(now time.Time, unixNano int64) string {
	if unixNano == 0 {
		return "-"
	}
	return Duration(now.Sub(time.Unix(0, unixNano)))
}

// Duration renders d as the CLI's tables do (views.Duration).
func Duration(d time.Duration) string { return views.Duration(d) }

// Bytes renders a byte count with a binary unit.
func Bytes(b uint64) string { return views.Bytes(b) }

// Rate renders bytes per second.
func Rate(b uint64) string {
	if b == 0 {
		return "0"
	}
	return views.Bytes(b) + "/s"
}

// JobState is a job's state name.
func JobState(j *api.Job) string { return views.JobStateName(j.GetState()) }

// Plan renders a job's tp·pp·dp (tp·cp·pp·dp with context parallelism),
// "-" when it has none.
func Plan(j *api.Job) string {
	p := j.GetPlan()
	if p.GetTp() == 0 && p.GetPp() == 0 && p.GetDp() == 0 {
		return "-"
	}
	if p.GetCp() > 1 {
		return fmt.Sprintf("%d·%d·%d·%d", max(p.GetTp(), 1), p.GetCp(), max(p.GetPp(), 1), max(p.GetDp(), 1))
	}
	return fmt.Sprintf("%d·%d·%d", max(p.GetTp(), 1), max(p.GetPp(), 1), max(p.GetDp(), 1))
}

// JobGPUs is how many GPUs a job holds now.
func JobGPUs(j *api.Job) int {
	n := 0
	for _, pn := range j.GetPlacement() {
		n += len(pn.GetRanks())
	}
	return n
}

// JobNodes lists the nodes of a job's placement.
func JobNodes(j *api.Job) []string {
	out := make([]string, 0, len(j.GetPlacement()))
	for _, pn := range j.GetPlacement() {
		out = append(out, pn.GetNode())
	}
	return out
}

// Secs renders seconds with two decimals, "-" when unknown.
func Secs(s float64) string {
	if s <= 0 {
		return "-"
	}
	if s >= 100 {
		return fmt.Sprintf("%.0fs", s)
	}
	return fmt.Sprintf("%.2fs", s)
}

// Percent renders a fraction as a percentage, "-" when unknown.
func Percent(f float64) string {
	if f <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", f*100)
}

// Trunc cuts s to at most n cells, marking the cut with an ellipsis.
func Trunc(s string, n int) string {
	if n <= 0 {
		return ""
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	if n == 1 {
		return "…"
	}
	return string(r[:n-1]) + "…"
}

// Pad pads or cuts s to exactly n cells (s holds no escape sequences).
func Pad(s string, n int) string {
	s = Trunc(s, n)
	if w := len([]rune(s)); w < n {
		return s + strings.Repeat(" ", n-w)
	}
	return s
}

// PadLeft right-aligns s in n cells.
func PadLeft(s string, n int) string {
	s = Trunc(s, n)
	if w := len([]rune(s)); w < n {
		return strings.Repeat(" ", n-w) + s
	}
	return s
}

// Labels renders a node's labels as k=v, sorted by key.
func Labels(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}
