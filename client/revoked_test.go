package client

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/transport"
)

// TestWatchEndsWhenTheUserIsRevoked: a viewer watches nodes on a real
// server and is revoked. The watch ends with the server's reason, before
// a second reconnect, instead of retrying for ever; the same holds for a
// watch started after the revocation.
func TestWatchEndsWhenTheUserIsRevoked(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, dir, "")
	ctx := testCtx(t)
	adm := dialServers(t, admin(t, dir), srv.Addr().String())
	viewerID, _, err := adm.AddUser(ctx, "watcher", transport.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	viewer := dialServers(t, viewerID, srv.Addr().String())
	watch := func(onSynced func()) (error, int32, time.Duration) {
		var disconnects atomic.Int32
		start := time.Now()
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		err := viewer.Watch(wctx, &api.WatchRequest{Kinds: []api.WatchKind{api.WatchKind_WATCH_KIND_NODES}},
			WatchOptions{OnDisconnect: func(error, time.Duration) { disconnects.Add(1) }},
			func(b *api.WatchBatch) error {
				if b.GetSynced() && onSynced != nil {
					onSynced()
					onSynced = nil
				}
				return nil
			})
		if wctx.Err() != nil {
			t.Fatalf("the watch still retried after %s (%d disconnects)", time.Since(start).Round(time.Millisecond), disconnects.Load())
		}
		return err, disconnects.Load(), time.Since(start)
	}
	revoked := make(chan error, 1)
	err, n, took := watch(func() {
		go func() {
			_, err := adm.RevokeUser(ctx, "watcher", "left the team")
			revoked <- err
		}()
	})
	// The revocation's own answer, before the admin's client is closed.
	if err := <-revoked; err != nil {
		t.Fatalf("revoke: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the watch ended with %v, want the revocation", err)
	}
	if n > 1 {
		t.Errorf("the watch reconnected %d times after the revocation", n)
	}
	t.Logf("open watch ended after %s, %d reconnect(s): %v", took.Round(time.Millisecond), n, err)

	err, n, took = watch(nil)
	if err == nil || !strings.Contains(err.Error(), "revoked") || n > 0 {
		t.Fatalf("a new watch by the revoked user ended with %v after %d reconnects, want the revocation at once", err, n)
	}
	t.Logf("new watch ended after %s: %v", took.Round(time.Millisecond), err)
}
