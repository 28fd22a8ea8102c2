// Package slurm runs gpuctl's jobs through Slurm: sbatch, squeue, scontrol,
// scancel and sinfo with fixed formats, their output parsed by pure
// functions; the executor the job owner calls, and the poller that feeds
// Slurm's view (jobs, node states) back to the owner and the registry.
package slurm

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
)

// The parsers of Slurm's command-line output. gpuctl asks for fixed
// formats (-o/--format, -P, --parsable) rather than --json, whose schema
// changes between Slurm versions; each parser is pure, and refuses what it
// cannot read with an error naming the line.

// maxHosts bounds one hostlist's expansion: node[1-99999999] is a typo,
// not a cluster.
const maxHosts = 1 << 16

// ExpandHostlist expands a Slurm hostlist ("node[1-3,5],gpu[01-02]-ib",
// "(null)" or "" for none) into host names, in Slurm's order, keeping
// zero padding.
func ExpandHostlist(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "(null)" || s == "None assigned" {
		return nil, nil
	}
	var out []string
	for _, item := range splitTop(s) {
		if item == "" {
			return nil, fmt.Errorf("hostlist %q: empty name", s)
		}
		hosts, err := expandOne(item, maxHosts-len(out))
		if err != nil {
			return nil, fmt.Errorf("hostlist %q: %w", s, err)
		}
		out = append(out, hosts...)
	}
	return out, nil
}

// splitTop splits at commas outside brackets.
func splitTop(s string) []string { return splitOutside(s, '[', ']') }

// splitOutside splits s at commas not between open and close.
func splitOutside(s string, open, close rune) []string {
	var out []string
	depth, start := 0, 0
	for i, r := range s {
		switch r {
		case open:
			depth++
		case close:
			depth--
		case ',':
			if depth == 0 {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	return append(out, s[start:])
}

// expandOne expands one name with any number of bracket groups
// ("rack[1-2]-n[1-2]" is four names).
func expandOne(item string, room int) ([]string, error) {
	open := strings.IndexByte(item, '[')
	if open < 0 {
		if strings.ContainsAny(item, "]") {
			return nil, fmt.Errorf("%q: ']' without '['", item)
		}
		return []string{item}, nil
	}
	end := strings.IndexByte(item[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: '[' without ']'", item)
	}
	end += open
	prefix, body, rest := item[:open], item[open+1:end], item[end+1:]
	if strings.ContainsAny(prefix, "]") || strings.ContainsAny(body, "[") {
		return nil, fmt.Errorf("%q: nested or unbalanced brackets", item)
	}
	var mids []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		if !isRange {
			hi = lo
		}
		if lo == "" || hi == "" || !digits(lo) || !digits(hi) {
			return nil, fmt.Errorf("%q: range %q is not N or N-M", item, r)
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || b < a {
			return nil, fmt.Errorf("%q: range %q is not N or N-M with N ≤ M", item, r)
		}
		if b-a >= room-len(mids) {
			return nil, fmt.Errorf("%q: more than %d hosts", item, maxHosts)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for n := a; n <= b; n++ {
			mids = append(mids, fmt.Sprintf("%0*d", width, n))
		}
	}
	tails, err := expandOne(rest, room/max(len(mids), 1))
	if err != nil {
		return nil, err
	}
	if len(mids)*len(tails) > room {
		return nil, fmt.Errorf("%q: more than %d hosts", item, maxHosts)
	}
	out := make([]string, 0, len(mids)*len(tails))
	for _, m := range mids {
		for _, t := range tails {
			out = append(out, prefix+m+t)
		}
	}
	return out, nil
}

func digits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return len(s) > 0 && len(s) <= 9
}

// ParseSbatch reads `sbatch --parsable`'s answer: "ID" or "ID;cluster".
func ParseSbatch(out string) (string, error) {
	line := strings.TrimSpace(out)
	if i := strings.LastIndexByte(line, '\n'); i >= 0 {
		// Warnings come before the id.
		line = strings.TrimSpace(line[i+1:])
	}
	id, _, _ := strings.Cut(line, ";")
	if id == "" || !digits(strings.ReplaceAll(id, "_", "")) {
		return "", fmt.Errorf("sbatch --parsable answered %q, not a job id", strings.TrimSpace(out))
	}
	return id, nil
}

// QueueFormat is the squeue format ParseSqueue reads; the free-text
// fields (comment, name) come last so a '|' in them cannot shift the
// others.
const QueueFormat = "%i|%T|%D|%N|%r|%k|%j"

// QueueJob is one line of squeue.
type QueueJob struct {
	ID, State string
	NumNodes  int
	// Nodes is the expanded node list (empty while pending).
	Nodes         []string
	Reason        string
	Comment, Name string
}

// ParseSqueue reads `squeue -h -o QueueFormat`.
func ParseSqueue(out string) ([]QueueJob, error) {
	var jobs []QueueJob
	for i, line := range lines(out) {
		f := strings.SplitN(line, "|", 7)
		if len(f) != 7 {
			return nil, fmt.Errorf("squeue line %d %q: want 7 fields (%s)", i+1, line, QueueFormat)
		}
		n, err := strconv.Atoi(f[2])
		if err != nil {
			return nil, fmt.Errorf("squeue line %d %q: node count %q: %v", i+1, line, f[2], err)
		}
		nodes, err := ExpandHostlist(f[3])
		if err != nil {
			return nil, fmt.Errorf("squeue line %d: %w", i+1, err)
		}
		if f[0] == "" {
			return nil, fmt.Errorf("squeue line %d %q: no job id", i+1, line)
		}
		comment := f[5]
		if comment == "(null)" {
			comment = ""
		}
		jobs = append(jobs, QueueJob{ID: f[0], State: f[1], NumNodes: n, Nodes: nodes, Reason: f[4], Comment: comment, Name: f[6]})
	}
	return jobs, nil
}

// NodeFormat is the sinfo format ParseSinfo reads (one line per node
// with -N; the reason, free text, last).
const NodeFormat = "%N|%T|%E"

// NodeState is one node as sinfo reports it.
type NodeState struct {
	Name string
	// State is the base state (idle, allocated, mixed, down, drained,
	// draining, …) without its flag suffixes.
	State string
	// NotResponding is sinfo's '*' suffix.
	NotResponding bool
	Reason        string
}

// Unavailable reports whether Slurm keeps jobs off the node.
func (n NodeState) Unavailable() bool {
	switch n.State {
	case "down", "drained", "draining", "drain", "fail", "failing", "maint", "future", "unknown", "inval":
		return true
	}
	return n.NotResponding
}

// Drained reports whether the node is drained or draining (a person or
// gpuctl took it out), as opposed to down.
func (n NodeState) Drained() bool {
	return n.State == "drained" || n.State == "draining" || n.State == "drain"
}

// ParseSinfo reads `sinfo -h -N -o NodeFormat`; a node listed twice
// (once per partition) is kept once.
func ParseSinfo(out string) ([]NodeState, error) {
	var nodes []NodeState
	seen := map[string]bool{}
	for i, line := range lines(out) {
		f := strings.SplitN(line, "|", 3)
		if len(f) != 3 || f[0] == "" || f[1] == "" {
			return nil, fmt.Errorf("sinfo line %d %q: want name|state|reason (%s)", i+1, line, NodeFormat)
		}
		st := strings.ToLower(f[1])
		n := NodeState{Name: f[0]}
		// Suffixes: * not responding, ~ powered off, # powering up, % powering
		// down, $ maintenance, @ pending reboot, ! pending power down, - planned.
		for len(st) > 0 && strings.ContainsRune("*~#%$@!^-", rune(st[len(st)-1])) {
			if st[len(st)-1] == '*' {
				n.NotResponding = true
			}
			st = st[:len(st)-1]
		}
		// Combined states (down+drain, idle+drain) are reported by their
		// strongest part.
		if base, flags, ok := strings.Cut(st, "+"); ok {
			st = base
			if base != "down" && strings.Contains(flags, "drain") {
				st = "drained"
			}
		}
		n.State = st
		if r := f[2]; r != "none" && r != "(null)" {
			n.Reason = r
		}
		if !seen[n.Name] {
			seen[n.Name] = true
			nodes = append(nodes, n)
		}
	}
	return nodes, nil
}

// JobInfo is one job of `scontrol show job -d`: its key=value fields and,
// per node group, the detail lines (Nodes=… CPU_IDs=… GRES=…).
type JobInfo struct {
	Fields  map[string]string
	Details []map[string]string
}

// Get returns a field, "" when absent or "(null)".
func (j JobInfo) Get(k string) string {
	if v := j.Fields[k]; v != "(null)" {
		return v
	}
	return ""
}

// ParseScontrolJobs reads `scontrol show job -d` (one or more jobs,
// separated by blank lines).
func ParseScontrolJobs(out string) ([]JobInfo, error) {
	var jobs []JobInfo
	var cur *JobInfo
	for i, raw := range strings.Split(out, "\n") {
		line := strings.TrimRightFunc(raw, unicode.IsSpace)
		if strings.TrimSpace(line) == "" {
			cur = nil
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "No jobs in the system") {
			continue
		}
		kv, err := splitKV(strings.TrimSpace(line))
		if err != nil {
			return nil, fmt.Errorf("scontrol show job line %d %q: %w", i+1, line, err)
		}
		// A detail line of -d: indented further, starting with Nodes=. It
		// belongs to the job above it and never starts one, whatever it holds.
		detail := strings.HasPrefix(strings.TrimSpace(line), "Nodes=") && strings.HasPrefix(raw, "     ")
		if _, ok := kv["JobId"]; ok && !detail {
			jobs = append(jobs, JobInfo{Fields: map[string]string{}})
			cur = &jobs[len(jobs)-1]
		}
		if cur == nil {
			return nil, fmt.Errorf("scontrol show job line %d %q: fields before a JobId=", i+1, line)
		}
		if detail {
			cur.Details = append(cur.Details, kv)
			continue
		}
		for k, v := range kv {
			cur.Fields[k] = v
		}
	}
	return jobs, nil
}

// splitKV splits "A=1 B=x y C=3" into fields: a field ends where the next
// " Key=" begins, so values may hold spaces (Command=, Reason=).
func splitKV(line string) (map[string]string, error) {
	out := map[string]string{}
	starts := []int{0}
	for i := 1; i < len(line); i++ {
		if line[i-1] == ' ' && line[i] != ' ' && isKeyAt(line[i:]) {
			starts = append(starts, i)
		}
	}
	for n, s := range starts {
		e := len(line)
		if n+1 < len(starts) {
			e = starts[n+1]
		}
		field := strings.TrimSpace(line[s:e])
		k, v, ok := strings.Cut(field, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", field)
		}
		out[k] = v
	}
	return out, nil
}

// isKeyAt reports whether s starts with a key and '='.
func isKeyAt(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '=':
			return i > 0
		case c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c == '_' || c == ':' || c == '/' || i > 0 && c >= '0' && c <= '9':
		default:
			return false
		}
	}
	return false
}

// AcctStep is one line of `sacct -P -n -o JobID,State,ExitCode,NodeList`.
type AcctStep struct {
	JobID, State, ExitCode string
	Nodes                  []string
}

// ParseSacct reads `sacct -P -n -o JobID,State,ExitCode,NodeList`.
func ParseSacct(out string) ([]AcctStep, error) {
	var steps []AcctStep
	for i, line := range lines(out) {
		f := strings.Split(line, "|")
		if len(f) != 4 || f[0] == "" {
			return nil, fmt.Errorf("sacct line %d %q: want JobID|State|ExitCode|NodeList", i+1, line)
		}
		nodes, err := ExpandHostlist(f[3])
		if err != nil {
			return nil, fmt.Errorf("sacct line %d: %w", i+1, err)
		}
		steps = append(steps, AcctStep{JobID: f[0], State: f[1], ExitCode: f[2], Nodes: nodes})
	}
	return steps, nil
}

func lines(out string) []string {
	var ls []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.TrimRight(l, "\r"); strings.TrimSpace(l) != "" {
			ls = append(ls, l)
		}
	}
	return ls
}
