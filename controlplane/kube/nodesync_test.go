package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

func TestSyncNodes(t *testing.T) {
	node := func(cordoned bool, reason string) *api.NodeStatus {
		return &api.NodeStatus{Registration: &api.NodeRegistration{Name: "n"}, Cordoned: cordoned, CordonReason: reason}
	}
	ready := NodeView{Name: "n", Ready: true}
	for _, tc := range []struct {
		name   string
		gpuctl *api.NodeStatus
		kube   NodeView
		want   []NodeAction
	}{
		{"both in", node(false, ""), ready, nil},
		{"gpuctl cordon → Node cordoned with its reason", node(true, "flaky NIC"), ready,
			[]NodeAction{{Node: "n", Do: ActionCordonNode, Reason: "flaky NIC"}}},
		{"gpuctl cordon already on the Node", node(true, "flaky NIC"), NodeView{Name: "n", Ready: true, Unschedulable: true, CordonedBy: "flaky NIC"}, nil},
		{"gpuctl uncordoned → lift gpuctl's Node cordon", node(false, ""), NodeView{Name: "n", Ready: true, Unschedulable: true, CordonedBy: "flaky NIC"},
			[]NodeAction{{Node: "n", Do: ActionUncordonNode, Reason: ""}}},
		{"NotReady → gpuctl cordons with why", node(false, ""), NodeView{Name: "n", NotReadyWhy: "NodeStatusUnknown Kubelet stopped posting node status."},
			[]NodeAction{{Node: "n", Do: nodes.ActionCordon, Reason: "Kubernetes: n is NotReady (NodeStatusUnknown Kubelet stopped posting node status.)"}}},
		{"cordoned in Kubernetes → gpuctl cordons", node(false, ""), NodeView{Name: "n", Ready: true, Unschedulable: true},
			[]NodeAction{{Node: "n", Do: nodes.ActionCordon, Reason: "Kubernetes: n is cordoned"}}},
		{"Ready and schedulable again → gpuctl lifts its Kubernetes cordon", node(true, "Kubernetes: n is NotReady (x)"), ready,
			[]NodeAction{{Node: "n", Do: nodes.ActionUncordon, Reason: ""}}},
		{"still NotReady → stays", node(true, "Kubernetes: n is NotReady (x)"), NodeView{Name: "n"}, nil},
		{"still cordoned in Kubernetes → stays", node(true, "Kubernetes: n is cordoned"), NodeView{Name: "n", Ready: true, Unschedulable: true}, nil},
		{"not a Kubernetes node", node(true, "x"), NodeView{Name: "other", Ready: true}, nil},
		// gpuctl binds past the scheduler: it honours taints itself.
		{"tainted in Kubernetes → gpuctl cordons", node(false, ""), NodeView{Name: "n", Ready: true, Taints: []string{"gpu=broken:NoSchedule"}},
			[]NodeAction{{Node: "n", Do: nodes.ActionCordon, Reason: "Kubernetes: n is tainted gpu=broken:NoSchedule"}}},
		{"still tainted → stays", node(true, "Kubernetes: n is tainted gpu=broken:NoSchedule"), NodeView{Name: "n", Ready: true, Taints: []string{"gpu=broken:NoSchedule"}}, nil},
		{"no allocatable GPUs → gpuctl cordons", node(false, ""), NodeView{Name: "n", Ready: true, NoGPUs: true},
			[]NodeAction{{Node: "n", Do: nodes.ActionCordon, Reason: "Kubernetes: n has no allocatable GPUs (is the device plugin running?)"}}},
		{"GPUs back → gpuctl lifts its Kubernetes cordon", node(true, "Kubernetes: n has no allocatable GPUs (is the device plugin running?)"), ready,
			[]NodeAction{{Node: "n", Do: nodes.ActionUncordon}}},
		{"taint lifted → gpuctl lifts its Kubernetes cordon", node(true, "Kubernetes: n is tainted gpu=broken:NoSchedule"), ready,
			[]NodeAction{{Node: "n", Do: nodes.ActionUncordon, Reason: ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SyncNodes([]*api.NodeStatus{tc.gpuctl}, []NodeView{tc.kube}); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestViewOfTaints: the taints that keep pods off are read; PreferNoSchedule
// and those that mirror unschedulable and Ready are not.
func TestViewOfTaints(t *testing.T) {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: corev1.NodeSpec{Taints: []corev1.Taint{
		{Key: "gpu", Value: "broken", Effect: corev1.TaintEffectNoSchedule},
		{Key: "maintenance", Effect: corev1.TaintEffectNoExecute},
		{Key: "spot", Effect: corev1.TaintEffectPreferNoSchedule},
		{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
	}}}
	if got, want := ViewOf(n, "").Taints, []string{"gpu=broken:NoSchedule", "maintenance:NoExecute"}; !reflect.DeepEqual(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
}

// TestSyncTopology: the Node's topology.gpuctl.io labels become gpuctl's
// topology labels of the node, set only where they differ.
func TestSyncTopology(t *testing.T) {
	reg := &api.NodeStatus{Registration: &api.NodeRegistration{Name: "n", Labels: map[string]string{"rack": "r1", "site": "eu"}}}
	for _, tc := range []struct {
		name string
		topo map[string]string
		want []NodeAction
	}{
		{"none", nil, nil},
		{"same", map[string]string{"rack": "r1"}, nil},
		{"moved rack and a switch", map[string]string{"rack": "r7", "switch": "s2", "site": "eu"},
			[]NodeAction{{Node: "n", Do: ActionLabels, Labels: map[string]string{"rack": "r7", "switch": "s2"}}}},
	} {
		if got := SyncNodes([]*api.NodeStatus{reg}, []NodeView{{Name: "n", Ready: true, Topology: tc.topo}}); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// TestViewOfGPUsAndTopology: a Node whose allocatable GPU resource is
// zero or absent has no GPUs for gpuctl's pods (when they ask for one);
// topology.gpuctl.io/KEY labels read as KEY.
func TestViewOfGPUsAndTopology(t *testing.T) {
	node := func(gpus string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{
			TopologyLabel + "rack": "r7", "topology.kubernetes.io/zone": "z1", TopologyLabel: "x"}}}
		if gpus != "" {
			n.Status.Allocatable = corev1.ResourceList{GPUResource: resource.MustParse(gpus)}
		}
		return n
	}
	for _, tc := range []struct {
		gpus, resource string
		noGPUs         bool
	}{
		{"8", GPUResource, false},
		{"0", GPUResource, true},
		{"", GPUResource, true},
		{"", "", false},
	} {
		v := ViewOf(node(tc.gpus), tc.resource)
		if v.NoGPUs != tc.noGPUs {
			t.Errorf("allocatable %q, resource %q: NoGPUs %v, want %v", tc.gpus, tc.resource, v.NoGPUs, tc.noGPUs)
		}
		if !reflect.DeepEqual(v.Topology, map[string]string{"rack": "r7"}) {
			t.Errorf("topology %v, want rack=r7", v.Topology)
		}
	}
}
