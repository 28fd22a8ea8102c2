package carbon

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// curve returns a curve of v every hour, with the hours in dip set to low.
func curve(v, low float64, dip ...int) *Curve {
	var h [Hours]float64
	for i := range h {
		h[i] = v
	}
	for _, i := range dip {
		h[i] = low
	}
	return NewCurve(h)
}

func line(sel string, v float64) string {
	return sel + strings.Repeat(fmt.Sprintf(" %g", v), Hours)
}

func TestParse(t *testing.T) {
	in, err := Parse(strings.NewReader("# sites\n\n"+line("site=eu-north", 40)+"  # hydro\n"+strings.ReplaceAll(line("site=us-east", 400), " ", ",")+"\n"), "ci.txt")
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Sources) != 2 || in.Sources[1].Selector() != "site=us-east" {
		t.Fatalf("sources %+v", in.Sources)
	}
	if c := in.Curve(map[string]string{"site": "us-east", "rack": "r1"}); c == nil || c.At(0) != 400 {
		t.Fatalf("us-east curve %v", c)
	}
	if c := in.Curve(map[string]string{"site": "ap-south"}); c != nil {
		t.Fatalf("a node of no listed site got a curve")
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "ci.txt: no curves"},
		{"# only a comment\n", "ci.txt: no curves"},
		{"eu-north 1 2 3\n", `ci.txt:1: "eu-north" is not a label selector`},
		{"\n" + line("site=a", 1) + " 5\n", "ci.txt:2: site=a has 25 values; give 24"},
		{"site=a 1 2\n", "ci.txt:1: site=a has 2 values"},
		{strings.Replace(line("site=a", 1), " 1", " x", 1), `ci.txt:1: site=a hour 0: "x" is not an intensity`},
		{line("site=a", -1), `hour 0: "-1" is not an intensity`},
		{line("site=a", math.NaN()), "is not an intensity"},
		{line("site=a", 1) + "\n" + line("site=a", 2), "ci.txt:2: site=a already has a curve on line 1"},
		{line("=a", 1), "is not a label selector"},
	} {
		_, err := Parse(strings.NewReader(tc.in), "ci.txt")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) = %v; want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func TestCurveMean(t *testing.T) {
	var h [Hours]float64
	for i := range h {
		h[i] = float64(i)
	}
	c := NewCurve(h)
	for _, tc := range []struct {
		from, to int64
		want     float64
	}{
		{0, 3600, 0},
		{3600, 7200, 1},
		{1800, 5400, 0.5},            // half of hour 0, half of hour 1
		{23 * hour, 25 * hour, 11.5}, // wraps into the next day
		{-hour, 0, 23},               // before the epoch: the previous day's 23:00
		{5 * day, 5*day + day, 11.5},
		{7200, 7200, 2}, // empty: the value at from
	} {
		if got := c.Mean(tc.from, tc.to); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("Mean(%d, %d) = %g; want %g", tc.from, tc.to, got, tc.want)
		}
	}
	if g := c.Grams(2, hour, 2*hour); g != 2 {
		t.Errorf("Grams(2 kW, hour 1) = %g; want 2 g", g)
	}
}

func TestDecide(t *testing.T) {
	dirty := curve(400, 100, 12, 13, 14) // a midday dip
	clean := curve(50, 50)
	flat := curve(300, 300)
	const min = 0.05
	for _, tc := range []struct {
		name     string
		sites    []*Curve
		now      int64
		deadline int64
		duration int64
		hold     bool
		start    int64
		site     int
	}{
		{"no curve runs now", nil, 0, day, hour, false, 0, 0},
		{"no estimate runs now", []*Curve{dirty}, 0, day, 0, false, 0, 0},
		{"waits for the dip", []*Curve{dirty}, 9 * hour, day, hour, true, 12 * hour, 0},
		{"deadline too close runs now", []*Curve{dirty}, 9 * hour, 12*hour + 1800, hour, false, 9 * hour, 0},
		{"dip reachable exactly at the deadline", []*Curve{dirty}, 9 * hour, 13 * hour, hour, true, 12 * hour, 0},
		{"deadline already missed runs now", []*Curve{dirty}, 9 * hour, 9 * hour, hour, false, 9 * hour, 0},
		{"inside the dip runs now", []*Curve{dirty}, 12*hour + 600, day, hour, false, 12*hour + 600, 0},
		// from 11:30 a 1 h run now is half dirty; 12:00 is all clean.
		{"half an hour before the dip waits to the boundary", []*Curve{dirty}, 11*hour + 1800, day, hour, true, 12 * hour, 0},
		{"a flat curve runs now", []*Curve{flat}, 3 * hour, day, hour, false, 3 * hour, 0},
		{"two sites: the clean one now beats the dip later", []*Curve{dirty, clean}, 9 * hour, day, hour, false, 9 * hour, 1},
		{"two sites: the dip beats a dirtier site now", []*Curve{dirty, flat}, 9 * hour, day, hour, true, 12 * hour, 0},
		{"a long run straddles the dip", []*Curve{dirty}, 0, 2 * day, 3 * hour, true, 12 * hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.sites, tc.now, tc.deadline, tc.duration, min)
			if d.Hold != tc.hold || d.Best.Start != tc.start || (len(tc.sites) > 0 && tc.duration > 0 && d.Best.Site != tc.site) {
				t.Fatalf("Decide = %+v; want hold %v start %d site %d", d, tc.hold, tc.start, tc.site)
			}
		})
	}
}

func TestDecideSmallSavingRunsNow(t *testing.T) {
	c := curve(100, 97, 12) // 3% cleaner at noon: below a 5% threshold
	if d := Decide([]*Curve{c}, 9*hour, day, hour, 0.05); d.Hold {
		t.Fatalf("held for a 3%% saving: %+v", d)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(line("site=a", 1))
	f.Add("# x\n" + line("site=b", 2.5) + "\n" + line("zone=c", 0))
	f.Add("site=a 1,2,3")
	f.Fuzz(func(t *testing.T, s string) {
		in, err := Parse(strings.NewReader(s), "f")
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f") {
				t.Fatalf("error without the file name: %v", err)
			}
			return
		}
		for _, src := range in.Sources {
			for _, v := range src.Curve.Hourly() {
				if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("accepted intensity %g", v)
				}
			}
			if m := src.Curve.Mean(-day, 3*day); m < 0 || math.IsNaN(m) {
				t.Fatalf("mean %g", m)
			}
		}
	})
}
