package heatmap

import (
	"testing"

	"github.com/gpuctl/gpuctl/tui/app"
	"github.com/gpuctl/gpuctl/tui/fixture"
)

func TestLayoutFits(t *testing.T) {
	for _, tc := range []struct {
		name        string
		nodes, w, h int
		color       bool
		perNode     bool
		scrolls     bool
	}{
		{"2000 nodes every GPU in 200x50 colour", 2000, 200, 45, true, false, false},
		{"2000 nodes at 80x24 colour aggregate, two nodes a cell", 2000, 80, 19, true, true, false},
		{"40 nodes at 80x24 mono every GPU", 40, 80, 19, false, false, false},
		{"2000 nodes at 80x24 mono aggregate and scroll", 2000, 80, 19, false, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fixture.Cluster(tc.nodes, 8)
			l := NewLayout(s.Nodes, tc.w, tc.h, Auto, tc.color)
			if l.PerNode != tc.perNode {
				t.Errorf("per node %v, want %v", l.PerNode, tc.perNode)
			}
			if got := l.Rows > tc.h; got != tc.scrolls {
				t.Errorf("rows %d in %d: scrolls %v, want %v", l.Rows, tc.h, got, tc.scrolls)
			}
			seen := 0
			for _, line := range l.Lines {
				if len(line)+l.Margin > tc.w {
					t.Errorf("a line is %d wide, more than %d", len(line)+l.Margin, tc.w)
				}
				for _, i := range line {
					if i >= 0 {
						seen++
					}
				}
			}
			if seen != tc.nodes {
				t.Errorf("layout holds %d nodes, want %d", seen, tc.nodes)
			}
		})
	}
}

// Consoles reading one history share its levels: one per metric.
func TestSharedLevels(t *testing.T) {
	s := fixture.Cluster(20, 8)
	h := app.NewRecorder().Observe(&s, 0)
	a, b := SharedLevels(h, Util, s.Nodes), SharedLevels(h, Util, s.Nodes)
	if a != b {
		t.Error("two consoles worked out the util levels of one snapshot each")
	}
	if SharedLevels(h, Temp, s.Nodes) == a {
		t.Error("the temperature levels are the util levels")
	}
	for i, n := range s.Nodes {
		for k, g := range n.GetGpus() {
			if got, want := int(a.gpu[i][k]), Level(Util, n, g); got != want {
				t.Fatalf("node %d GPU %d: level %d, want %d", i, k, got, want)
			}
		}
	}
}
