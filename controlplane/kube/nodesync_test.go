package kube

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
			[]NodeAction{{"n", ActionCordonNode, "flaky NIC"}}},
		{"gpuctl cordon already on the Node", node(true, "flaky NIC"), NodeView{Name: "n", Ready: true, Unschedulable: true, CordonedBy: "flaky NIC"}, nil},
		{"gpuctl uncordoned → lift gpuctl's Node cordon", node(false, ""), NodeView{Name: "n", Ready: true, Unschedulable: true, CordonedBy: "flaky NIC"},
			[]NodeAction{{"n", ActionUncordonNode, ""}}},
		{"NotReady → gpuctl cordons with why", node(false, ""), NodeView{Name: "n", NotReadyWhy: "NodeStatusUnknown Kubelet stopped posting node status."},
			[]NodeAction{{"n", nodes.ActionCordon, "Kubernetes: n is NotReady (NodeStatusUnknown Kubelet stopped posting node status.)"}}},
		{"cordoned in Kubernetes → gpuctl cordons", node(false, ""), NodeView{Name: "n", Ready: true, Unschedulable: true},
			[]NodeAction{{"n", nodes.ActionCordon, "Kubernetes: n is cordoned"}}},
		{"Ready and schedulable again → gpuctl lifts its Kubernetes cordon", node(true, "Kubernetes: n is NotReady (x)"), ready,
			[]NodeAction{{"n", nodes.ActionUncordon, ""}}},
		{"still NotReady → stays", node(true, "Kubernetes: n is NotReady (x)"), NodeView{Name: "n"}, nil},
		{"still cordoned in Kubernetes → stays", node(true, "Kubernetes: n is cordoned"), NodeView{Name: "n", Ready: true, Unschedulable: true}, nil},
		{"not a Kubernetes node", node(true, "x"), NodeView{Name: "other", Ready: true}, nil},
		// gpuctl binds past the scheduler: it honours taints itself.
		{"tainted in Kubernetes → gpuctl cordons", node(false, ""), NodeView{Name: "n", Ready: true, Taints: []string{"gpu=broken:NoSchedule"}},
			[]NodeAction{{"n", nodes.ActionCordon, "Kubernetes: n is tainted gpu=broken:NoSchedule"}}},
		{"still tainted → stays", node(true, "Kubernetes: n is tainted gpu=broken:NoSchedule"), NodeView{Name: "n", Ready: true, Taints: []string{"gpu=broken:NoSchedule"}}, nil},
		{"taint lifted → gpuctl lifts its Kubernetes cordon", node(true, "Kubernetes: n is tainted gpu=broken:NoSchedule"), ready,
			[]NodeAction{{"n", nodes.ActionUncordon, ""}}},
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
	if got, want := ViewOf(n).Taints, []string{"gpu=broken:NoSchedule", "maintenance:NoExecute"}; !reflect.DeepEqual(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
}
