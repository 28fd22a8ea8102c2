package views

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/api"
)

func TestSelectNodes(t *testing.T) {
	var nodes []*api.NodeStatus
	for _, name := range []string{"n2", "n0", "n1"} {
		nodes = append(nodes, &api.NodeStatus{Registration: &api.NodeRegistration{Name: name}})
	}
	tests := []struct {
		name  string
		names []string
		want  string
		err   string
	}{
		{"none named keeps all", nil, "n2 n0 n1", ""},
		{"in the order named", []string{"n1", "n2"}, "n1 n2", ""},
		{"a typo says what exists", []string{"n1", "n9"}, "", "no node named \"n9\": known nodes are n[0-2] (`gpuctl nodes` lists them)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SelectNodes(nodes, tc.names)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, n := range got {
				names = append(names, n.GetRegistration().GetName())
			}
			if strings.Join(names, " ") != tc.want {
				t.Errorf("selected %v, want %s", names, tc.want)
			}
		})
	}
}

func TestNodeActionText(t *testing.T) {
	node := &api.NodeStatus{Registration: &api.NodeRegistration{Name: "n1"}, State: api.NodeState_NODE_STATE_READY, Connected: true,
		Cordoned: true, CordonReason: "bad\x1b[2J fan"}
	var b bytes.Buffer
	for _, tc := range []struct {
		action string
		r      *api.CordonResponse
	}{
		{"cordon", &api.CordonResponse{Node: node}},
		{"drain", &api.CordonResponse{Node: node}},
		{"drain", &api.CordonResponse{Node: node, Jobs: []*api.DrainedJob{
			{Job: "j-1", Moving: true, To: []string{"n2", "n3"}},
			{Job: "j-2", Reason: "no checkpoint: stays until it ends"}}}},
		{"uncordon", &api.CordonResponse{Node: &api.NodeStatus{Registration: &api.NodeRegistration{Name: "n4"}, State: api.NodeState_NODE_STATE_DOWN}}},
	} {
		b.WriteString("$ " + tc.action + "\n")
		if err := NodeActionText(&b, tc.action, tc.r); err != nil {
			t.Fatal(err)
		}
	}
	golden(t, b.Bytes())
}

func TestLastLines(t *testing.T) {
	tests := []struct {
		name, data string
		n          int
		want       string
		more       bool
	}{
		{"fewer lines than asked", "a\nb\n", 5, "a\nb\n", false},
		{"the last two", "a\nb\nc\n", 2, "b\nc\n", true},
		{"a last line without a break counts", "a\nb\nc", 1, "c", true},
		{"empty", "", 3, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, more := LastLines([]byte(tc.data), tc.n)
			if string(got) != tc.want || more != tc.more {
				t.Errorf("LastLines(%q, %d) = %q, %v; want %q, %v", tc.data, tc.n, got, more, tc.want, tc.more)
			}
		})
	}
}

func TestParseGPUName(t *testing.T) {
	tests := []struct {
		in    string
		node  string
		index int
		ok    bool
	}{
		{"n1/3", "n1", 3, true},
		{"rack-a:n1:0", "rack-a:n1", 0, true},
		{"GPU-8c2f1a", "", 0, false},
		{"/3", "", 0, false},
		{"n1/-1", "", 0, false},
	}
	for _, tc := range tests {
		node, index, ok := ParseGPUName(tc.in)
		if node != tc.node || index != tc.index || ok != tc.ok {
			t.Errorf("ParseGPUName(%q) = %q, %d, %v; want %q, %d, %v", tc.in, node, index, ok, tc.node, tc.index, tc.ok)
		}
	}
}

func FuzzParseGPUName(f *testing.F) {
	for _, s := range []string{"n1/3", "a:b:7", "GPU-8c2f1a", "/", "n1/+1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		node, index, ok := ParseGPUName(s)
		if !ok {
			return
		}
		if node == "" || index < 0 || !strings.HasPrefix(s, node) {
			t.Fatalf("ParseGPUName(%q) = %q, %d: a name is NODE/INDEX with both present", s, node, index)
		}
	})
}
