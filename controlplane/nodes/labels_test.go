package nodes

import (
	"maps"
	"strings"
	"testing"
)

// TestSetLabels: labels another system is the source of land over the
// node's registered ones, persist, and say so once; the registration the
// statuses share is not changed in place; an unknown node is named.
func TestSetLabels(t *testing.T) {
	st := newStore(t)
	r, err := New(Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	registerIdle(t, r, reg("a", 2, 1000))
	before := r.Nodes()[0]
	beforeLabels := maps.Clone(before.GetRegistration().GetLabels())
	n, err := r.SetLabels("a", map[string]string{"rack": "r7"}, "its Kubernetes Node's labels")
	if err != nil {
		t.Fatal(err)
	}
	if n.GetRegistration().GetLabels()["rack"] != "r7" {
		t.Fatalf("labels %v, want rack=r7", n.GetRegistration().GetLabels())
	}
	if !maps.Equal(before.GetRegistration().GetLabels(), beforeLabels) {
		t.Fatalf("the earlier status's labels changed to %v", before.GetRegistration().GetLabels())
	}
	stored, err := st.Nodes()
	if err != nil || len(stored) != 1 || stored[0].GetRegistration().GetLabels()["rack"] != "r7" {
		t.Fatalf("stored %v (%v)", stored, err)
	}
	again, err := r.SetLabels("a", map[string]string{"rack": "r7"}, "x")
	if err != nil || again != n {
		t.Fatalf("setting the same labels again changed the node: %v", err)
	}
	if _, err := r.SetLabels("b", map[string]string{"rack": "r1"}, "x"); err == nil || !strings.Contains(err.Error(), `unknown node "b"`) {
		t.Fatalf("unknown node: %v", err)
	}
}
