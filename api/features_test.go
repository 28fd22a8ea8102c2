package api

import (
	"slices"
	"testing"
)

// TestPeerFeatures: a v1.1 peer has what it lists; every v1.2 peer has the
// features of v1.2 without a list; a feature that came later counts only
// when listed.
func TestPeerFeatures(t *testing.T) {
	v := func(minor uint32) *Version { return &Version{Major: 1, Minor: minor} }
	all := []string{FeatureFence, FeatureLease, FeatureNodeRank, FeatureRunAs}
	tests := []struct {
		name  string
		hello *Hello
		want  []string
	}{
		{"v1.1 without a list", &Hello{Version: v(1)}, nil},
		{"v1.1 listing fence", &Hello{Version: v(1), Features: []string{FeatureFence}}, []string{FeatureFence}},
		{"v1.2 without a list", &Hello{Version: v(2)}, all},
		{"v1.3 listing its own", &Hello{Version: v(3), Features: NodeFeatures()}, append(slices.Clone(all), FeaturePeerLease, FeatureTelemetryPace, FeatureDenyList)},
		{"v1.3 without peer-lease", &Hello{Version: v(3), Features: all}, all},
		{"a later feature, listed", &Hello{Version: v(4), Features: []string{"lease-v2"}}, append(slices.Clone(all), "lease-v2")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := PeerFeatures(tc.hello)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("PeerFeatures = %v, want %v", got, want)
			}
		})
	}
}
