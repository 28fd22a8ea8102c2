// Package predict learns how long a job will run from the cluster's
// finished jobs, using only what is known when a job is submitted.
//
// The model is a back-off over groups of similar past jobs, most specific
// first: the same user and job name (with its numbers taken out), the same
// name, the same user, the tenant at that size, that size at that time of day, that size,
// and all jobs. A job is predicted from the first group with enough
// members: the geometric mean of their runtimes (runtimes spread over
// orders of magnitude, so they are averaged as logarithms). A job's own
// limit, when it gives one, caps the prediction: it is stopped there.
// HPC schedulers have long found that such history-based predictions
// order and backfill jobs better than users' own limits, which are mostly
// overestimates in a few round values (Tsafrir, Etsion and Feitelson,
// "Backfilling using system-generated predictions rather than user
// runtime estimates", IEEE TPDS 2007).
//
// Pure: no clock, no I/O beyond reading and writing a model.
package predict

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Features are what is known of a job when it is submitted.
type Features struct {
	Tenant, User, Name string
	GPUs               int
	// Limit is the job's own runtime limit in seconds (0: none).
	Limit int64
	// Hour is the hour of day it was submitted, 0–23 (-1: unknown).
	Hour int
}

// Record is a finished job: what was known at its submission, and how
// long it ran, in seconds.
type Record struct {
	Features
	Runtime int64
}

// Version is the model file's format.
const Version = 1

// DefaultMinSupport is how many past jobs a group needs to be used.
const DefaultMinSupport = 3

// Model is a trained predictor. It is read-only once trained.
type Model struct {
	Version int `json:"version"`
	// MinSupport is how many past jobs a group needs to be used.
	MinSupport int `json:"min_support"`
	// Groups are the past jobs' log-runtime statistics by group key.
	Groups map[string]Group `json:"groups"`
}

// Group summarises the runtimes of the past jobs of one group.
type Group struct {
	N int `json:"n"`
	// LogMean is the mean of their natural-log runtimes (seconds).
	LogMean float64 `json:"log_mean"`
}

// Prediction is a predicted runtime and the group it came from.
type Prediction struct {
	Seconds int64
	// Basis names the group ("user+name", "name", "user", "tenant+gpus",
	// "gpus+hour", "gpus", "all"), "none" when nothing was learned.
	Basis string
	// Support is how many past jobs the group held.
	Support int
}

// level is one step of the back-off: its name, and the job's key in it
// ("" when the job lacks what the level needs).
type level struct {
	name string
	key  func(Features) string
}

var levels = []level{
	{"user+name", func(f Features) string {
		if f.User == "" || f.Name == "" {
			return ""
		}
		return f.User + "\x00" + NamePattern(f.Name)
	}},
	{"name", func(f Features) string {
		if f.Name == "" {
			return ""
		}
		return NamePattern(f.Name)
	}},
	{"user", func(f Features) string { return f.User }},
	{"tenant+gpus", func(f Features) string {
		if f.Tenant == "" {
			return ""
		}
		return f.Tenant + "\x00" + sizeClass(f.GPUs)
	}},
	{"gpus+hour", func(f Features) string {
		if f.Hour < 0 || f.Hour > 23 {
			return ""
		}
		return sizeClass(f.GPUs) + "\x00" + strconv.Itoa(f.Hour/6)
	}},
	{"gpus", func(f Features) string { return sizeClass(f.GPUs) }},
	{"all", func(Features) string { return "*" }},
}

// sizeClass buckets a GPU count by powers of two (a 12-GPU job is like a
// 16-GPU one).
func sizeClass(gpus int) string {
	c := 1
	for c < gpus {
		c *= 2
	}
	return strconv.Itoa(c)
}

// NamePattern is a job name with its runs of digits replaced by '#', so
// that "bert-large-run17" and "bert-large-run18" are one pattern.
func NamePattern(name string) string {
	var b strings.Builder
	digits := false
	for _, r := range name {
		if r >= '0' && r <= '9' {
			if !digits {
				b.WriteByte('#')
			}
			digits = true
			continue
		}
		digits = false
		b.WriteRune(r)
	}
	return b.String()
}

// Train builds a model from finished jobs (those with a runtime below one
// second are skipped). minSupport ≤ 0 takes DefaultMinSupport.
func Train(records []Record, minSupport int) *Model {
	if minSupport <= 0 {
		minSupport = DefaultMinSupport
	}
	sums := map[string]*Group{}
	for _, r := range records {
		if r.Runtime < 1 {
			continue
		}
		lr := math.Log(float64(r.Runtime))
		for _, l := range levels {
			k := l.key(r.Features)
			if k == "" {
				continue
			}
			g := sums[l.name+":"+k]
			if g == nil {
				g = &Group{}
				sums[l.name+":"+k] = g
			}
			g.N++
			g.LogMean += lr
		}
	}
	m := &Model{Version: Version, MinSupport: minSupport, Groups: make(map[string]Group, len(sums))}
	for k, g := range sums {
		m.Groups[k] = Group{N: g.N, LogMean: g.LogMean / float64(g.N)}
	}
	return m
}

// Predict is the runtime predicted for a job with features f.
func (m *Model) Predict(f Features) Prediction {
	p := Prediction{Basis: "none"}
	if m != nil {
		for _, l := range levels {
			k := l.key(f)
			if k == "" {
				continue
			}
			if g, ok := m.Groups[l.name+":"+k]; ok && g.N >= m.MinSupport {
				p = Prediction{Seconds: max(int64(math.Round(math.Exp(g.LogMean))), 1), Basis: l.name, Support: g.N}
				break
			}
		}
	}
	if f.Limit > 0 && (p.Seconds == 0 || p.Seconds > f.Limit) {
		p.Seconds = f.Limit
		if p.Basis == "none" {
			p.Basis = "limit"
		}
	}
	return p
}

// Overall is one runtime for every job: the geometric mean of all the
// jobs learned from, the baseline a model must beat (0 with none).
func (m *Model) Overall() int64 {
	g, ok := m.Groups["all:*"]
	if !ok {
		return 0
	}
	return max(int64(math.Round(math.Exp(g.LogMean))), 1)
}

// Remaining is what is left of a prediction for a job that has run ran
// seconds, at least a minute. A job still running past its prediction is
// expected to run half as long again as it has: the longer a job has
// run, the longer it tends to run on.
func Remaining(predicted, ran int64) int64 {
	if ran < predicted {
		return max(predicted-ran, 60)
	}
	return max(ran/2, 60)
}

// Write encodes the model as JSON.
func (m *Model) Write(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	if err := enc.Encode(m); err != nil {
		return fmt.Errorf("write runtime model: %w", err)
	}
	return nil
}

// Read decodes a model written by Write, refusing one it cannot use.
func Read(r io.Reader) (*Model, error) {
	var m Model
	dec := json.NewDecoder(io.LimitReader(r, 64<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("runtime model: %w (train one with `gpuctl simulate train`)", err)
	}
	switch {
	case m.Version != Version:
		return nil, fmt.Errorf("runtime model: format version %d, this gpuctl reads %d: train it again with this gpuctl", m.Version, Version)
	case m.MinSupport < 1:
		return nil, fmt.Errorf("runtime model: min_support %d, want at least 1", m.MinSupport)
	}
	names := make([]string, 0, len(levels))
	for _, l := range levels {
		names = append(names, l.name)
	}
	for k, g := range m.Groups {
		lvl, _, ok := strings.Cut(k, ":")
		switch {
		case !ok || !slices.Contains(names, lvl):
			return nil, fmt.Errorf("runtime model: group %q is of no known kind (%s)", k, strings.Join(names, ", "))
		case g.N < 1:
			return nil, fmt.Errorf("runtime model: group %q has %d jobs", k, g.N)
		case math.IsNaN(g.LogMean) || math.IsInf(g.LogMean, 0) || g.LogMean < 0 || g.LogMean > 30:
			return nil, fmt.Errorf("runtime model: group %q has log-mean runtime %v, outside 0–30", k, g.LogMean)
		}
	}
	return &m, nil
}

// Standard limits users pick, in hours: a limit is mostly a round value
// (see the package comment).
var roundLimits = []int64{1, 2, 4, 8, 12, 24, 48, 72, 168}

// ModelledLimit is a user's runtime limit for a job that ran actual
// seconds, for traces that record none: the runtime times an
// overestimate factor, log-normal with median 2.5 and log-sd 0.9 drawn
// from the standard normal z and never below 1 (a limit below the runtime
// would have stopped the job), rounded up to the next standard limit.
func ModelledLimit(actual int64, z float64) int64 {
	f := max(math.Exp(math.Log(2.5)+0.9*z), 1)
	want := float64(actual) * f
	for _, h := range roundLimits {
		if float64(h*3600) >= want {
			return h * 3600
		}
	}
	// Past a week: whole weeks.
	week := float64(168 * 3600)
	return int64(math.Ceil(want/week) * week)
}

// Accuracy is how well estimates matched runtimes.
type Accuracy struct {
	N int
	// MedianFactor is the median of max(est/actual, actual/est): 1 is
	// exact, 2 is off by a factor of two either way.
	MedianFactor float64
	// Within2 is the fraction within a factor of two.
	Within2 float64
	// Under is the fraction estimated short of their runtime.
	Under float64
}

// Score compares estimates with actual runtimes (same order, both in
// seconds, estimates ≥ 1).
func Score(est, actual []int64) Accuracy {
	a := Accuracy{N: min(len(est), len(actual))}
	if a.N == 0 {
		return a
	}
	factors := make([]float64, a.N)
	for i := range a.N {
		e, r := float64(max(est[i], 1)), float64(max(actual[i], 1))
		factors[i] = max(e/r, r/e)
		if factors[i] <= 2 {
			a.Within2++
		}
		if e < r {
			a.Under++
		}
	}
	slices.Sort(factors)
	if a.N%2 == 1 {
		a.MedianFactor = factors[a.N/2]
	} else {
		a.MedianFactor = (factors[a.N/2-1] + factors[a.N/2]) / 2
	}
	a.Within2 /= float64(a.N)
	a.Under /= float64(a.N)
	return a
}
