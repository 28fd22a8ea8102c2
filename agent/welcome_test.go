package agent

import (
	"errors"
	"testing"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// TestWelcomeRefusals: a refusal this nodemon can never overcome at that
// server (another major, a feature it lacks) is final; a standby's is not.
func TestWelcomeRefusals(t *testing.T) {
	final := func(err error) bool { var r *transport.RefusedError; return errors.As(err, &r) }
	standby := func(err error) bool { var n *transport.NotLeaderError; return errors.As(err, &n) }
	tests := []struct {
		name string
		w    *api.Welcome
		want func(error) bool
	}{
		{"welcome", &api.Welcome{Version: api.CurrentVersion(), Features: api.NodeFeatures()}, func(err error) bool { return err == nil }},
		{"another major", &api.Welcome{Version: &api.Version{Major: 2}, Error: "v2"}, final},
		{"a feature this nodemon lacks", &api.Welcome{Version: api.CurrentVersion(), Error: "needs lease-v2", Features: []string{api.FeatureFence, "lease-v2"}}, final},
		{"features this nodemon has", &api.Welcome{Version: api.CurrentVersion(), Error: "no leader yet", Features: api.NodeFeatures()}, standby},
		{"a standby naming the leader", &api.Welcome{Version: api.CurrentVersion(), Error: "standby", LeaderAddr: "b:7443"}, standby},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := welcomeError(tc.w); !tc.want(err) {
				t.Errorf("welcomeError = %v (%T)", err, err)
			}
		})
	}
}
