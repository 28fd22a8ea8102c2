package jobs

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// effect is a side effect decided by the owner and carried out after its
// step is committed: commands sent through the dispatcher, whose answers
// come back to the owner as messages.
type effect func(d *dispatcher)

// dispatcher sends the owner's commands without the owner waiting for
// them. Each node has one queue, drained in order by one goroutine, so a
// node sees a job's launch before the signal that follows it, and a node
// that stopped answering holds up only its own queue.
type dispatcher struct {
	send func(ctx context.Context, node string, c *api.Command) (*api.CommandAck, error)
	log  *slog.Logger
	// exec, when set, launches and signals attempts instead of nodemon.
	exec Executor

	mu     sync.Mutex
	ctx    context.Context
	queues map[string]*cmdQueue
	// sync runs every command inline, for tests that step the owner by
	// hand.
	sync bool
}

type cmdQueue struct {
	items   []cmdItem
	running bool
}

type cmdItem struct {
	cmd     *api.Command
	timeout time.Duration
	done    func(*api.CommandAck, error)
}

func newDispatcher(send func(context.Context, string, *api.Command) (*api.CommandAck, error), log *slog.Logger) *dispatcher {
	return &dispatcher{send: send, log: log, ctx: context.Background(), queues: map[string]*cmdQueue{}}
}

// start binds the dispatcher's commands to ctx: they end with it.
func (d *dispatcher) start(ctx context.Context) {
	d.mu.Lock()
	d.ctx = ctx
	d.mu.Unlock()
}

// enqueue queues c for node; done (may be nil) hears the answer.
func (d *dispatcher) enqueue(node string, c *api.Command, timeout time.Duration, done func(*api.CommandAck, error)) {
	it := cmdItem{cmd: c, timeout: timeout, done: done}
	d.mu.Lock()
	if d.sync {
		ctx := d.ctx
		d.mu.Unlock()
		d.run(ctx, node, it)
		return
	}
	q := d.queues[node]
	if q == nil {
		q = &cmdQueue{}
		d.queues[node] = q
	}
	q.items = append(q.items, it)
	if !q.running {
		q.running = true
		go d.drain(node, q)
	}
	d.mu.Unlock()
}

func (d *dispatcher) drain(node string, q *cmdQueue) {
	for {
		d.mu.Lock()
		if len(q.items) == 0 {
			q.running = false
			delete(d.queues, node)
			d.mu.Unlock()
			return
		}
		it := q.items[0]
		q.items = q.items[1:]
		ctx := d.ctx
		d.mu.Unlock()
		d.run(ctx, node, it)
	}
}

func (d *dispatcher) run(ctx context.Context, node string, it cmdItem) {
	cctx, cancel := context.WithTimeout(ctx, it.timeout)
	ack, err := d.send(cctx, node, it.cmd)
	cancel()
	if it.done != nil {
		it.done(ack, err)
	}
}

// fanOut sends one command per node and calls done, once, with the
// failures when every node has answered.
func (d *dispatcher) fanOut(nodes []string, mk func(node string) *api.Command, timeout time.Duration, done func(errs map[string]error)) {
	if len(nodes) == 0 {
		if done != nil {
			done(nil)
		}
		return
	}
	var (
		mu   sync.Mutex
		left = len(nodes)
		errs = map[string]error{}
	)
	for _, node := range nodes {
		d.enqueue(node, mk(node), timeout, func(_ *api.CommandAck, err error) {
			mu.Lock()
			if err != nil {
				errs[node] = err
			}
			left--
			last := left == 0
			mu.Unlock()
			if last && done != nil {
				done(errs)
			}
		})
	}
}

// async runs fn off the owner's goroutine (inline in tests that step the
// owner by hand).
func (d *dispatcher) async(fn func()) {
	d.mu.Lock()
	sync := d.sync
	d.mu.Unlock()
	if sync {
		fn()
		return
	}
	go fn()
}
