package stall

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Rule says how long the ranks of a communicator may disagree with no
// progress before it is stalled. Each communicator learns its own cadence:
// every time its ranks disagree (some inside a collective or past it, the
// slowest not), how long the others waited until the slowest moved, and a
// wait of nothing for each pass that saw it progress with nobody waiting.
// That is a collective's duration when all enter together, and the skew of
// compute, data loading and checkpoint writes between ranks. Once it has
// MinSamples of them, its limit is max(Floor, K × the Quantile of those
// waits, LongestFactor × the longest healthy wait seen), so a wait the job
// already made once (rank 0 writing a checkpoint every N steps) is never a
// stall. While every rank sits inside one collective, the same rule reads
// the waits of that op at that size (a power of two) once it has
// MinSamples of them: a large all-gather may take longer than the job's
// usual wait, a small all-reduce far less.
// A job's explicit stall_threshold bounds the learned limit from above and
// is the limit until enough is learned; a job without one waits Default.
type Rule struct {
	K             float64
	Quantile      float64
	Floor         time.Duration
	LongestFactor float64
	MinSamples    int
	Default       time.Duration
	// Pass is the detector's period: an update more than half a second
	// later than that means the server itself stood still (SIGSTOP,
	// starvation), and every communicator not yet stalled is credited the
	// pause, as the node registry credits its nodes. 0 credits nothing.
	Pass time.Duration
}

// DefaultRule is the rule gpuctl serve runs. The floor is eight of the
// detector's 250 ms passes: nodes report a rank's progress every 250 ms, so
// an interval is seen with up to half a second of error either way.
// Twenty intervals are seconds of a job at the demo's pace, and the 10-minute
// default before them is PyTorch's watchdog.
var DefaultRule = Rule{K: 4, Quantile: 0.99, Floor: 2 * time.Second, LongestFactor: 1.5, MinSamples: 20, Default: 10 * time.Minute,
	Pass: 250 * time.Millisecond}

// Limit is the limit a communicator is held to now and why.
type Limit struct {
	Limit time.Duration
	// Basis is "learned", "stall_threshold" (the job's bound: nothing
	// learned yet, or below what was learned) or "default".
	Basis string
	// Samples, Quantile and Longest are what was learned.
	Samples  int
	Quantile time.Duration
	Longest  time.Duration
}

// String says the limit and where it comes from, for an event.
func (l Limit) String() string {
	switch l.Basis {
	case "learned":
		return fmt.Sprintf("limit %s learned from %d intervals (p99 %s, longest %s)", l.Limit, l.Samples, l.Quantile, l.Longest)
	case "stall_threshold":
		return fmt.Sprintf("limit %s: the job's stall_threshold", l.Limit)
	}
	return fmt.Sprintf("limit %s: the default until %d intervals are learned", l.Limit, DefaultRule.MinSamples)
}

// The histogram's buckets grow by 25% from 10 ms; the last one holds
// everything past about 3.5 hours.
const (
	buckets     = 64
	bucketBase  = 10 * time.Millisecond
	bucketRatio = 1.25
	// agingAt halves the counts once this many intervals are held, so the
	// quantile follows a job whose pace changes.
	agingAt = 4096
)

// maxOpSizes bounds the (op, size) pairs a communicator keeps waits of;
// a pair past them is learned only in the communicator's whole.
const maxOpSizes = 16

// cadence is what one communicator has shown of its pace, in bounded
// memory: every wait, and apart the waits of every rank inside one
// collective (its duration) by op and size.
type cadence struct {
	attempt uint32
	// low is the slowest rank's position at the last pass.
	low  uint64
	seen bool
	waits
	ops map[opSize]*waits
}

// opSize is a collective's op and its size's power of two.
type opSize struct {
	op   string
	size int
}

func opSizeOf(c *Call) opSize { return opSize{c.Op, bits.Len64(c.Bytes)} }

// addOp learns a wait of every rank inside one collective of kind k.
func (c *cadence) addOp(k opSize, d time.Duration) {
	w := c.ops[k]
	if w == nil {
		if len(c.ops) >= maxOpSizes {
			return
		}
		if c.ops == nil {
			c.ops = map[opSize]*waits{}
		}
		w = &waits{}
		c.ops[k] = w
	}
	w.add(d)
}

// waits is a histogram of waits in fixed memory.
type waits struct {
	hist    [buckets]uint32
	n       uint32
	longest time.Duration
}

func bucketOf(d time.Duration) int {
	if d <= bucketBase {
		return 0
	}
	i := int(math.Log(float64(d)/float64(bucketBase)) / math.Log(bucketRatio))
	return min(i, buckets-1)
}

// upper is bucket i's upper edge: a quantile read from the histogram errs
// on the long side, by at most a quarter.
func upper(i int) time.Duration {
	return time.Duration(float64(bucketBase) * math.Pow(bucketRatio, float64(i+1)))
}

func (c *waits) add(d time.Duration) {
	c.hist[bucketOf(d)]++
	c.n++
	c.longest = max(c.longest, d)
	if c.n >= agingAt {
		c.n = 0
		for i := range c.hist {
			c.hist[i] /= 2
			c.n += c.hist[i]
		}
	}
}

func (c *waits) quantile(q float64) time.Duration {
	want := uint32(math.Ceil(q * float64(c.n)))
	var seen uint32
	for i, k := range c.hist {
		seen += k
		if seen >= want && seen > 0 {
			return upper(i)
		}
	}
	return 0
}

// limit is the rule applied to what c learned, under the job's bound (0:
// none).
func (r Rule) limit(c *waits, bound time.Duration) Limit {
	if c == nil || int(c.n) < r.MinSamples {
		if bound > 0 {
			return Limit{Limit: bound, Basis: "stall_threshold"}
		}
		return Limit{Limit: r.Default, Basis: "default"}
	}
	q := c.quantile(r.Quantile)
	l := Limit{Basis: "learned", Samples: int(c.n), Quantile: q, Longest: c.longest.Round(time.Millisecond),
		Limit: max(r.Floor, time.Duration(r.K*float64(q)), time.Duration(r.LongestFactor*float64(c.longest)))}
	l.Limit = l.Limit.Round(time.Millisecond)
	if bound > 0 && bound < l.Limit {
		l.Limit, l.Basis = bound, "stall_threshold"
	}
	return l
}
