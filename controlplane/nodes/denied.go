package nodes

import (
	"slices"
	"sync"

	"github.com/gpuctl/gpuctl/api"
)

// Denied peers: a node removed from the cluster is refused at every
// handshake with the server, but its peers would go on vouching for its
// ranks (the peer lease) until its certificate expires. So every node that
// honours the deny-list is told the revoked node certificates (DeniedPeers)
// on its control stream, after a heartbeat, whenever it has not heard the
// current list on this session; as a witness it vouches for none of them.

// deniedPeers is the list the server sends, with a revision that counts
// its changes (0: never set, so nothing is sent and nodes keep theirs).
type deniedPeers struct {
	mu      sync.Mutex
	serials []string
	rev     uint64
}

// SetDeniedPeers replaces the revoked node certificate serials that nodes
// are told; each node hears the new list after its next heartbeat.
func (r *Registry) SetDeniedPeers(serials []string) {
	serials = slices.Compact(slices.Sorted(slices.Values(serials)))
	d := &r.denied
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.rev > 0 && slices.Equal(d.serials, serials) {
		return
	}
	d.serials, d.rev = serials, d.rev+1
}

// current returns the list and its revision.
func (d *deniedPeers) current() (uint64, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rev, d.serials
}

// sendDeniedPeers sends the node the current list unless it heard it on
// this session. Only the session's control reader calls it.
func (ns *session) sendDeniedPeers() error {
	if !ns.uses(api.FeatureDenyList) {
		return nil
	}
	rev, serials := ns.r.denied.current()
	if rev == 0 || rev == ns.deniedSent {
		return nil
	}
	ns.deniedSent = rev
	return ns.send(&api.ServerMessage{Body: &api.ServerMessage_DeniedPeers{DeniedPeers: &api.DeniedPeers{Serials: serials}}})
}
