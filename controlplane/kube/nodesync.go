package kube

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane/nodes"
)

// Node states follow each other both ways, as with Slurm: a gpuctl cordon
// cordons the Node (spec.unschedulable, gpuctl's reason in
// CordonAnnotation); a Node NotReady, cordoned or tainted NoSchedule or
// NoExecute in Kubernetes is cordoned in gpuctl with a reason starting
// KubeReason. Each side lifts only what
// it set.
const (
	KubeReason       = "Kubernetes: "
	CordonAnnotation = "gpuctl.io/cordon-reason"
)

// Actions on the Kubernetes side (gpuctl's are nodes.ActionCordon and
// nodes.ActionUncordon).
const (
	ActionCordonNode   = "cordon-node"
	ActionUncordonNode = "uncordon-node"
)

// NodeView is what the sync reads of a Kubernetes Node.
type NodeView struct {
	Name          string
	Ready         bool
	NotReadyWhy   string
	Unschedulable bool
	// CordonedBy is gpuctl's reason when gpuctl cordoned the Node.
	CordonedBy string
	// Taints keep pods off the Node (NoSchedule, NoExecute), as
	// key=value:Effect; gpuctl binds its pods itself, past the scheduler
	// that would honour them, so it honours them. Those that mirror
	// Unschedulable and Ready are left out.
	Taints []string
	// NoGPUs: the Node's allocatable GPU resource (the one gpuctl's pods
	// ask for) is zero or absent, so the kubelet would refuse them: its
	// device plugin is not running, or every GPU is unhealthy.
	NoGPUs bool
	// Topology is what the Node's topology.gpuctl.io/KEY labels say (rack,
	// switch, …), keyed as gpuctl's own labels are (KEY).
	Topology map[string]string
}

// TopologyLabel prefixes the Node labels that give gpuctl's topology
// labels (topology.gpuctl.io/rack=r7 is rack=r7).
const TopologyLabel = "topology.gpuctl.io/"

// ViewOf reads a Node; gpuResource is the resource gpuctl's pods ask for
// ("" none).
func ViewOf(n *corev1.Node, gpuResource string) NodeView {
	v := NodeView{Name: n.Name, Unschedulable: n.Spec.Unschedulable, CordonedBy: n.Annotations[CordonAnnotation], NotReadyWhy: "no Ready condition"}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			v.Ready = c.Status == corev1.ConditionTrue
			v.NotReadyWhy = strings.TrimSpace(c.Reason + " " + c.Message)
		}
	}
	for _, t := range n.Spec.Taints {
		switch t.Key {
		case corev1.TaintNodeUnschedulable, corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable:
			continue
		}
		if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
			v.Taints = append(v.Taints, t.ToString())
		}
	}
	if gpuResource != "" {
		q, ok := n.Status.Allocatable[corev1.ResourceName(gpuResource)]
		v.NoGPUs = !ok || q.IsZero()
	}
	for k, val := range n.Labels {
		if key, ok := strings.CutPrefix(k, TopologyLabel); ok && key != "" {
			if v.Topology == nil {
				v.Topology = map[string]string{}
			}
			v.Topology[key] = val
		}
	}
	return v
}

// NodeAction is one step that brings the two views of a node together.
type NodeAction struct {
	Node, Do, Reason string
	// Labels are the topology labels to set (ActionLabels).
	Labels map[string]string
}

// ActionLabels sets gpuctl's topology labels of a node from its Node's.
const ActionLabels = "labels"

// SyncNodes decides how to bring gpuctl's and Kubernetes' views of the
// nodes both know together.
func SyncNodes(gpuctl []*api.NodeStatus, kube []NodeView) []NodeAction {
	byName := make(map[string]NodeView, len(kube))
	for _, k := range kube {
		byName[k.Name] = k
	}
	var out []NodeAction
	for _, n := range gpuctl {
		name := n.GetRegistration().GetName()
		k, ok := byName[name]
		if !ok {
			continue
		}
		reason := n.GetCordonReason()
		fromKube := strings.HasPrefix(reason, KubeReason)
		ourCordon := k.Unschedulable && k.CordonedBy != ""
		add := func(do, why string) { out = append(out, NodeAction{Node: name, Do: do, Reason: why}) }
		keptOff := keptOffWhy(k, ourCordon)
		switch {
		case n.GetCordoned() && !fromKube && !k.Unschedulable:
			// gpuctl took it out (an operator, a recovery).
			add(ActionCordonNode, orCordoned(reason))
		case n.GetCordoned() && fromKube && keptOff == "":
			add(nodes.ActionUncordon, "")
		case !n.GetCordoned() && ourCordon:
			add(ActionUncordonNode, "")
		case !n.GetCordoned() && keptOff != "":
			add(nodes.ActionCordon, KubeReason+keptOff)
		}
		if set := changedLabels(n.GetRegistration().GetLabels(), k.Topology); set != nil {
			out = append(out, NodeAction{Node: name, Do: ActionLabels, Labels: set})
		}
	}
	return out
}

// keptOffWhy says why Kubernetes keeps pods off a Node ("" when it does
// not); gpuctl's own cordon of it aside.
func keptOffWhy(k NodeView, ourCordon bool) string {
	switch {
	case !k.Ready:
		return k.Name + " is NotReady (" + api.CleanText(k.NotReadyWhy, 0) + ")"
	case k.Unschedulable && !ourCordon:
		return k.Name + " is cordoned"
	case len(k.Taints) > 0:
		return k.Name + " is tainted " + api.CleanText(strings.Join(k.Taints, ", "), 0)
	case k.NoGPUs:
		return k.Name + " has no allocatable GPUs (is the device plugin running?)"
	}
	return ""
}

// changedLabels are the labels of want that have lacks or holds
// otherwise: nil when none.
func changedLabels(have, want map[string]string) map[string]string {
	var out map[string]string
	for k, v := range want {
		if have[k] != v {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

func orCordoned(s string) string {
	if s == "" {
		return "cordoned in gpuctl"
	}
	return s
}
