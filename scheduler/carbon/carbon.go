// Package carbon is the pure side of carbon-aware scheduling: carbon
// intensity curves (gCO2e per kWh by UTC hour) per node label value, their
// lookups, and the rule that decides whether a deferrable job should wait
// for a cleaner hour or site. It reads no clock: times are Unix seconds
// passed in, and the only input it reads is the io.Reader given to Parse.
package carbon

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Hours is how many hourly values a curve has: it covers one day and
// repeats daily, hour 0 being 00:00–01:00 UTC.
const Hours = 24

const (
	hour = 3600
	day  = Hours * hour
)

// Curve is one day of carbon intensity, gCO2e/kWh by UTC hour. Build it with
// NewCurve, which also precomputes the running sums Mean uses.
type Curve struct {
	hourly [Hours]float64
	// cum[h] is the integral (gCO2e/kWh · s) from 00:00 to hour h.
	cum [Hours + 1]float64
}

// NewCurve returns the curve of the given hourly values.
func NewCurve(hourly [Hours]float64) *Curve {
	c := &Curve{hourly: hourly}
	for h, v := range hourly {
		c.cum[h+1] = c.cum[h] + v*hour
	}
	return c
}

// Hourly returns the curve's 24 values.
func (c *Curve) Hourly() [Hours]float64 { return c.hourly }

// At returns the intensity at Unix time t.
func (c *Curve) At(t int64) float64 {
	return c.hourly[floorMod(t, day)/hour]
}

// integral is ∫ intensity dt from the Unix epoch to t (gCO2e/kWh · s).
func (c *Curve) integral(t int64) float64 {
	days := floorDiv(t, day)
	in := t - days*day
	h := in / hour
	return float64(days)*c.cum[Hours] + c.cum[h] + c.hourly[h%Hours]*float64(in-h*hour)
}

// Mean returns the mean intensity over [from, to); At(from) when the
// interval is empty.
func (c *Curve) Mean(from, to int64) float64 {
	if to <= from {
		return c.At(from)
	}
	return (c.integral(to) - c.integral(from)) / float64(to-from)
}

// Grams returns the emissions (gCO2e) of drawing kW kilowatts over
// [from, to).
func (c *Curve) Grams(kW float64, from, to int64) float64 {
	if to <= from {
		return 0
	}
	return kW * (c.integral(to) - c.integral(from)) / hour
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

// Source is one curve and the nodes it applies to: those whose label Key
// has the value Value.
type Source struct {
	Key, Value string
	Curve      *Curve
}

// Selector returns "key=value".
func (s Source) Selector() string { return s.Key + "=" + s.Value }

// Intensities is a set of sources; a node takes the first one, in file
// order, that its labels match.
type Intensities struct {
	Sources []Source
}

// For returns the index of the source that applies to a node with these
// labels, and false when none does.
func (in *Intensities) For(labels map[string]string) (int, bool) {
	if in == nil {
		return 0, false
	}
	for i, s := range in.Sources {
		if v, ok := labels[s.Key]; ok && v == s.Value {
			return i, true
		}
	}
	return 0, false
}

// Curve returns the curve that applies to a node with these labels, or nil.
func (in *Intensities) Curve(labels map[string]string) *Curve {
	if i, ok := in.For(labels); ok {
		return in.Sources[i].Curve
	}
	return nil
}

// Parse reads a carbon-intensity file. name is used in errors only. The
// format, one curve a line:
//
//	# comments and blank lines are ignored
//	site=eu-north  45 44 43 ... (24 values)
//
// A line is a label selector (key=value) and 24 gCO2e/kWh values for the
// UTC hours 0–23, separated by spaces, tabs or commas; the curve repeats
// every day. A selector may appear once.
func Parse(r io.Reader, name string) (*Intensities, error) {
	in := &Intensities{}
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	line := 0
	for sc.Scan() {
		line++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		fields := strings.FieldsFunc(text, func(r rune) bool { return r == ' ' || r == '\t' || r == ',' || r == '\r' })
		if len(fields) == 0 {
			continue
		}
		src, err := parseLine(fields)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if prev, dup := seen[src.Selector()]; dup {
			return nil, fmt.Errorf("%s:%d: %s already has a curve on line %d; give each label value one line", name, line, src.Selector(), prev)
		}
		seen[src.Selector()] = line
		in.Sources = append(in.Sources, src)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	if len(in.Sources) == 0 {
		return nil, fmt.Errorf("%s: no curves; write one line per label value: key=value and %d hourly gCO2e/kWh values", name, Hours)
	}
	return in, nil
}

func parseLine(fields []string) (Source, error) {
	k, v, ok := strings.Cut(fields[0], "=")
	if !ok || k == "" || v == "" {
		return Source{}, fmt.Errorf("%q is not a label selector; start the line with key=value (e.g. site=eu-north)", fields[0])
	}
	vals := fields[1:]
	if len(vals) != Hours {
		return Source{}, fmt.Errorf("%s has %d values; give %d, one gCO2e/kWh value per UTC hour 0–23", fields[0], len(vals), Hours)
	}
	var hourly [Hours]float64
	for h, s := range vals {
		x, err := strconv.ParseFloat(s, 64)
		if err != nil || math.IsNaN(x) || math.IsInf(x, 0) || x < 0 || x > 1e5 {
			return Source{}, fmt.Errorf("%s hour %d: %q is not an intensity; give a number of gCO2e/kWh from 0 to 100000", fields[0], h, s)
		}
		hourly[h] = x
	}
	return Source{Key: k, Value: v, Curve: NewCurve(hourly)}, nil
}
