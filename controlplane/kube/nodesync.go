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
}

// ViewOf reads a Node.
func ViewOf(n *corev1.Node) NodeView {
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
	return v
}

// NodeAction is one step that brings the two views of a node together.
type NodeAction struct {
	Node, Do, Reason string
}

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
		switch {
		case n.GetCordoned() && !fromKube && !k.Unschedulable:
			// gpuctl took it out (an operator, a recovery).
			add(ActionCordonNode, orCordoned(reason))
		case n.GetCordoned() && fromKube && k.Ready && !k.Unschedulable && len(k.Taints) == 0:
			add(nodes.ActionUncordon, "")
		case !n.GetCordoned() && ourCordon:
			add(ActionUncordonNode, "")
		case !n.GetCordoned() && !k.Ready:
			add(nodes.ActionCordon, KubeReason+name+" is NotReady ("+api.CleanText(k.NotReadyWhy, 0)+")")
		case !n.GetCordoned() && k.Unschedulable && !ourCordon:
			add(nodes.ActionCordon, KubeReason+name+" is cordoned")
		case !n.GetCordoned() && len(k.Taints) > 0:
			add(nodes.ActionCordon, KubeReason+name+" is tainted "+api.CleanText(strings.Join(k.Taints, ", "), 0))
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
