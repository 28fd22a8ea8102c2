package etcdstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// Health reports every member of the etcd cluster, for gpuctl status:
// its name and client endpoint, whether it leads raft, and why it is not
// healthy (unreachable, or an alarm such as NOSPACE). The error is only
// for a cluster that cannot even list its members.
func (s *Store) Health(ctx context.Context) ([]*api.StoreMember, error) {
	lctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	ml, err := s.cli.MemberList(lctx)
	if err != nil {
		return nil, fmt.Errorf("etcd store: list etcd members: %w", err)
	}
	out := make([]*api.StoreMember, len(ml.Members))
	var wg sync.WaitGroup
	for i, m := range ml.Members {
		sm := &api.StoreMember{Name: m.Name}
		out[i] = sm
		if len(m.ClientURLs) == 0 {
			sm.Error = "not started yet (no client URL)"
			continue
		}
		sm.Endpoint = m.ClientURLs[0]
		wg.Go(func() {
			sctx, cancel := context.WithTimeout(ctx, time.Second) // a dead member must not hold up gpuctl status
			defer cancel()
			st, err := s.cli.Status(sctx, sm.Endpoint)
			if err != nil {
				sm.Error = err.Error()
				return
			}
			sm.Leader = st.Leader == m.ID
			sm.Healthy = len(st.Errors) == 0
			sm.Error = strings.Join(st.Errors, "; ")
		})
	}
	wg.Wait()
	return out, nil
}
