package ha

import (
	"context"
	"slices"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
)

// healthReporter is a store that can say how its members are (etcd's).
type healthReporter interface {
	Health(ctx context.Context) ([]*api.StoreMember, error)
}

// leadershipShown is how many leadership changes gpuctl status lists.
const leadershipShown = 20

// Status is gpuctl status as this server sees it.
func Status(ctx context.Context, m *Member, st store.Store) *api.StatusResponse {
	resp := &api.StatusResponse{Self: m.Self(), Leader: m.Leader(), Store: "etcd", StoreHealthy: true}
	servers, err := m.Servers(ctx)
	if err != nil {
		resp.StoreHealthy, resp.StoreError = false, err.Error()
	}
	resp.Servers = servers
	if h, ok := st.(healthReporter); ok {
		members, err := h.Health(ctx)
		if err != nil {
			resp.StoreHealthy, resp.StoreError = false, err.Error()
		}
		resp.StoreMembers = members
	}
	// The leadership events are few among many; the newest few thousand
	// events hold the recent ones.
	evs, err := st.Events(store.EventFilter{Limit: 5000})
	if err != nil && resp.StoreHealthy {
		resp.StoreHealthy, resp.StoreError = false, err.Error()
	}
	for _, e := range slices.Backward(evs) {
		if e.GetKind() == api.EventKind_EVENT_KIND_LEADER {
			resp.Leadership = append(resp.Leadership, e)
			if len(resp.Leadership) == leadershipShown {
				break
			}
		}
	}
	return resp
}
