package jobs

import (
	"sync/atomic"

	"github.com/gpuctl/gpuctl/api"
)

// Front is the job owner's front door: its queue, and the jobs it last
// committed. The node registry and the job owner each need the other at
// construction; the registry only queues what happens to nodes and reads
// committed jobs, so it is built with the Front, the owner after it
// (Config.Front), and nothing is wired late.
type Front struct {
	in   inbox
	view atomic.Pointer[View]
}

// NewFront makes the queue an owner will drain once it is built.
func NewFront() *Front {
	f := &Front{}
	f.in.sig = make(chan struct{}, 1)
	return f
}

// NodeUp, NodeDown and NodeEvents make the Front a nodes.Sink: they only
// queue, so the registry may call them under its lock, and before the
// owner has loaded (it drains them once it runs).
func (f *Front) NodeUp(name string, reg *api.NodeRegistration, _ bool) {
	f.in.post(msgNodeUp{node: name, reg: reg})
}

// NodeDown queues a node's loss.
func (f *Front) NodeDown(name, reason string) { f.in.post(msgNodeDown{node: name, reason: reason}) }

// NodeEvents queues a node's persisted events.
func (f *Front) NodeEvents(name string, events []*api.Event) {
	f.in.post(msgNodeEvents{node: name, events: events})
}

// View returns the committed jobs (nil before the owner has loaded);
// readers share them and must not modify them.
func (f *Front) View() *View { return f.view.Load() }
