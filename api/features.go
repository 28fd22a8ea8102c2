package api

import (
	"fmt"
	"slices"
	"strings"
)

// Features a nodemon names in its hello: what it can honour beyond the
// messages of its protocol version. They are names, not fields, so a
// feature added later (a lease with another meaning, say) is one more
// name here, with no change to Hello or Welcome.
const (
	// FeatureLease: the node runs its ranks on the welcome's lease,
	// renewed by LeaseRenewal, and their shims stop them when it runs out.
	FeatureLease = "lease"
	// FeatureFence: SignalRanks.attempt limits a signal to one attempt and
	// SignalRanks.fence kills a superseded one, answered with
	// CommandAck.killed. A node without it signals every rank of the job.
	FeatureFence = "fence"
	// FeatureRunAs: LaunchRanks.run_as_user and run_as_group.
	FeatureRunAs = "run-as"
	// FeatureNodeRank: LaunchRanks.node_rank and num_nodes (NODE_RANK in
	// the rank's environment).
	FeatureNodeRank = "node-rank"
	// FeaturePeerLease: the node also renews its ranks' lease from a
	// majority of the witnesses named in LaunchRanks.witnesses, answers
	// other nodes' vouch requests on NodeRegistration.peer_addr, and
	// honours Supersede. A node without it is no witness, and its ranks
	// live on the server's lease alone.
	FeaturePeerLease = "peer-lease"
	// FeatureTelemetryPace: the node honours TelemetryPace, sending its
	// telemetry less often while the server is overloaded. A node without
	// it keeps its pace, and the server sheds what it cannot apply.
	FeatureTelemetryPace = "telemetry-pace"
	// FeatureDenyList: the node honours DeniedPeers, vouching as a witness
	// for no peer whose certificate the cluster revoked. A node without it
	// vouches for a removed node until that node's certificate expires.
	FeatureDenyList = "deny-list"
)

// featureWhy says what goes wrong with a node that lacks a feature.
var featureWhy = map[string]string{
	FeatureLease:         "its ranks would run on when it is cut off from the server",
	FeatureFence:         "fencing an old attempt would stop every rank of the job on the node",
	FeatureRunAs:         "its ranks would run as root, not as the job's user",
	FeatureNodeRank:      "its ranks would not be given NODE_RANK",
	FeaturePeerLease:     "its ranks would stop whenever no server answers for a lease",
	FeatureTelemetryPace: "an overloaded server could only shed its telemetry, not slow it",
	FeatureDenyList:      "as a witness it would keep a removed node's ranks alive",
}

// NodeFeatures are the features this build's nodemon has.
func NodeFeatures() []string {
	return []string{FeatureLease, FeatureFence, FeatureRunAs, FeatureNodeRank, FeaturePeerLease, FeatureTelemetryPace, FeatureDenyList}
}

// v12Features are the features every nodemon of protocol v1.2 has: they
// came after v1.1 without a version change, so a v1.1 nodemon has them
// only if its hello lists them, and a v1.2 one sends no list.
var v12Features = []string{FeatureLease, FeatureFence, FeatureRunAs, FeatureNodeRank}

// PeerFeatures returns the features of the peer that sent h: those it
// lists, and those every release of its version has. Features that came
// after v1.3 count only when listed.
func PeerFeatures(h *Hello) []string {
	out := slices.Clone(h.GetFeatures())
	if v := h.GetVersion(); v.GetMajor() > 1 || v.GetMajor() == 1 && v.GetMinor() >= 2 {
		out = append(out, v12Features...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// MissingFeatures returns the features of need that have lacks, in the
// order of need.
func MissingFeatures(have, need []string) []string {
	var out []string
	for _, f := range need {
		if !slices.Contains(have, f) {
			out = append(out, f)
		}
	}
	return out
}

// FeatureError is a node refused at hello for lacking features the server
// needs; its message names the version, the features and what to do.
type FeatureError struct {
	Version *Version
	Missing []string
}

func (e *FeatureError) Error() string {
	var why []string
	for _, f := range e.Missing {
		why = append(why, fmt.Sprintf("%s (without it %s)", f, featureWhy[f]))
	}
	return fmt.Sprintf("nodemon speaks gpuctl protocol v%d.%d without %s, which this server needs: upgrade nodemon to a release of protocol v1.2 or later (this server is gpuctl %s, protocol v%d.%d)",
		e.Version.GetMajor(), e.Version.GetMinor(), strings.Join(why, ", "), Release, ProtocolMajor, ProtocolMinor)
}

// CommandNeeds returns the features a node needs to carry out c as meant.
func CommandNeeds(c *Command) []string {
	var out []string
	switch b := c.GetBody().(type) {
	case *Command_Signal:
		if b.Signal.GetAttempt() != 0 || b.Signal.GetFence() {
			out = append(out, FeatureFence)
		}
	case *Command_Launch:
		if b.Launch.GetRunAsUser() != "" || b.Launch.GetRunAsGroup() != "" {
			out = append(out, FeatureRunAs)
		}
		if b.Launch.GetNumNodes() > 0 {
			out = append(out, FeatureNodeRank)
		}
		if len(b.Launch.GetWitnesses()) > 0 {
			out = append(out, FeaturePeerLease)
		}
	case *Command_Supersede:
		out = append(out, FeaturePeerLease)
	}
	return out
}
