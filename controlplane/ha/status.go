package ha

import (
	"context"
	"slices"
	"sync"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/controlplane"
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
	return (&statusView{m: m, st: st}).Status(ctx)
}

// statusView answers gpuctl status, from what it last read while the store
// is away (ro): the servers listed then and the leadership changes, with
// the store unhealthy and why.
type statusView struct {
	m  *Member
	st store.Store
	ro *controlplane.ReadOnly

	mu         sync.Mutex
	servers    []*api.ServerStatus
	members    []*api.StoreMember
	leadership []*api.Event
}

// Status is gpuctl status as this server sees it.
func (v *statusView) Status(ctx context.Context) *api.StatusResponse {
	resp := &api.StatusResponse{Self: v.m.Self(), Leader: v.m.Leader(), Store: "etcd", StoreHealthy: true}
	if err := v.ro.StoreAway(); err != nil {
		v.mu.Lock()
		defer v.mu.Unlock()
		resp.StoreHealthy, resp.StoreError = false, err.Error()
		resp.Servers, resp.StoreMembers, resp.Leadership = v.servers, v.members, v.leadership
		return resp
	}
	servers, err := v.m.Servers(ctx)
	if err != nil {
		resp.StoreHealthy, resp.StoreError = false, err.Error()
	}
	resp.Servers = servers
	if h, ok := v.st.(healthReporter); ok {
		members, err := h.Health(ctx)
		if err != nil {
			resp.StoreHealthy, resp.StoreError = false, err.Error()
		}
		resp.StoreMembers = members
	}
	// The leadership events are few among many; the newest few thousand
	// events hold the recent ones.
	evs, err := v.st.Events(store.EventFilter{Limit: 5000})
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
	if resp.StoreHealthy {
		v.mu.Lock()
		v.servers, v.members, v.leadership = resp.Servers, resp.StoreMembers, resp.Leadership
		v.mu.Unlock()
	}
	return resp
}
