package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// WatchOptions tunes Watch; zero fields take the defaults noted.
type WatchOptions struct {
	// Backoff paces reconnects, default 200 ms doubling to 5 s.
	Backoff *transport.Backoff
	// OnDisconnect, when set, hears each lost watch with why and the
	// pause before the next try, so a console can show a banner.
	OnDisconnect func(err error, retryIn time.Duration)
	Log          *slog.Logger
}

// Watch follows the kinds req names. fn gets every batch in order: the
// first is a snapshot (Snapshot set, Synced on its last part), then changes.
// When the connection drops, Watch reconnects with backoff and resumes from
// the last batch fn applied: the server sends only what changed since, or
// a new snapshot (Snapshot, with ResyncReason) when it no longer can. Watch
// returns nil when ctx ends, or fn's error.
func (c *Client) Watch(ctx context.Context, req *api.WatchRequest, opt WatchOptions, fn func(*api.WatchBatch) error) error {
	bo := opt.Backoff
	if bo == nil {
		bo = &transport.Backoff{Base: 200 * time.Millisecond, Max: 5 * time.Second, ResetAfter: 10 * time.Second}
	}
	log := opt.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	epoch, rev := req.GetEpoch(), req.GetSinceRevision()
	partial := false
	for {
		start := time.Now()
		cur := &api.WatchRequest{Kinds: req.GetKinds(), Epoch: epoch, SinceRevision: rev, EventsBacklog: req.GetEventsBacklog()}
		var fnErr error
		err := c.t.Call(ctx, &api.ClientRequest{Body: &api.ClientRequest_Watch{Watch: cur}}, func(r *api.ClientResponse) error {
			if msg := r.GetError(); msg != "" {
				return &serverError{msg: msg}
			}
			b := r.GetWatch()
			if b == nil {
				return nil
			}
			if fnErr = fn(b); fnErr != nil {
				return fnErr
			}
			if b.GetSnapshot() {
				partial = true
			}
			if b.GetSynced() {
				partial = false
			}
			if partial {
				// A snapshot cut short cannot be resumed: the next try
				// starts a new one.
				epoch, rev = "", 0
			} else {
				epoch, rev = b.GetEpoch(), b.GetRevision()
			}
			return nil
		})
		switch {
		case ctx.Err() != nil:
			return nil
		case fnErr != nil:
			return fnErr
		}
		var se *serverError
		if errors.As(err, &se) {
			// The server refused the watch itself (permission, bad
			// request): retrying would only be refused again.
			return errors.New(se.msg)
		}
		var refused *transport.RefusedError
		if errors.As(err, &refused) {
			// The server refused this client (a revoked certificate):
			// every server refuses it, and every retry would be.
			return refused
		}
		if err == nil {
			err = errors.New("the server ended the watch")
		}
		bo.Ended(time.Since(start))
		pause := bo.Next()
		log.Debug("watch lost; resuming", "err", err, "retry_in", pause, "revision", rev)
		if opt.OnDisconnect != nil {
			opt.OnDisconnect(err, pause)
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// serverError is an error answer from the server, as opposed to a lost
// connection.
type serverError struct{ msg string }

func (e *serverError) Error() string { return e.msg }

// WatchKindName is a watch kind as people read it: nodes, jobs, events,
// stalls.
func WatchKindName(k api.WatchKind) string {
	switch k {
	case api.WatchKind_WATCH_KIND_NODES:
		return "nodes"
	case api.WatchKind_WATCH_KIND_JOBS:
		return "jobs"
	case api.WatchKind_WATCH_KIND_EVENTS:
		return "events"
	case api.WatchKind_WATCH_KIND_STALLS:
		return "stalls"
	}
	return fmt.Sprintf("kind(%d)", int32(k))
}
