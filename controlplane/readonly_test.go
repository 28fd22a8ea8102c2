package controlplane

import (
	"context"
	"crypto/x509"
	"errors"
	"math/big"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/transport"
)

// TestReadOnlyFollowsTheProbe: the control plane turns read-only at the
// first failed probe of its store, saying what is away and since when,
// tells whoever listens, and is writable again at the first answer.
func TestReadOnlyFollowsTheProbe(t *testing.T) {
	var down atomic.Bool
	ro := &ReadOnly{What: "etcd at http://127.0.0.1:2379"}
	var mu sync.Mutex
	var told []error
	stop := ro.Notify(func(err error) {
		mu.Lock()
		told = append(told, err)
		mu.Unlock()
	})
	defer stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go ro.Watch(ctx, func(context.Context) error {
		if down.Load() {
			return errors.New("context deadline exceeded")
		}
		return nil
	})
	wait := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := ro.Err(); err != nil {
		t.Fatalf("read-only with the store up: %v", err)
	}
	down.Store(true)
	wait("read-only", func() bool { return ro.Err() != nil })
	err := ro.Err()
	var roErr *ReadOnlyError
	if !errors.Is(err, ErrReadOnly) || !errors.As(err, &roErr) || roErr.Since.IsZero() {
		t.Fatalf("the refusal %v is not a ReadOnlyError with its time", err)
	}
	for _, want := range []string{"the store (etcd at http://127.0.0.1:2379) is unreachable since ", "the control plane is read-only; retry when it returns"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the reason %q lacks %q", err, want)
		}
	}
	if ro.StoreAway() == nil {
		t.Error("StoreAway is nil while the store is away")
	}
	// A second cause (the election key lost) does not hide the store.
	ro.Hold("leadership", "this server's election key vanished")
	if !strings.Contains(ro.Err().Error(), "unreachable") {
		t.Errorf("with the store away and the key lost the reason is %q, want the store's", ro.Err())
	}
	down.Store(false)
	wait("the store's cause ended", func() bool { return ro.StoreAway() == nil })
	if err := ro.Err(); err == nil || !strings.Contains(err.Error(), "election key") {
		t.Errorf("with the key still lost: %v", err)
	}
	ro.Release("leadership")
	if err := ro.Err(); err != nil {
		t.Errorf("writable again, yet %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) < 2 || told[0] == nil || told[len(told)-1] != nil {
		t.Errorf("listeners were told %v, want read-only first and writable last", told)
	}
}

// denyStore answers the deny-list from a map, or fails as an unreachable
// store does.
type denyStore struct {
	store.IdentityStore
	away    bool
	revoked map[string]*api.Revocation
}

func (d *denyStore) Revocation(serial string) (*api.Revocation, error) {
	if d.away {
		return nil, errors.New("etcd unreachable: context deadline exceeded")
	}
	if r, ok := d.revoked[serial]; ok {
		return r, nil
	}
	return nil, store.ErrNotFound
}

// TestDenyListAsLastRead: while the deny-list cannot be read, a
// certificate is judged as it was last read (admitted, or refused as
// revoked); one never checked is refused, saying why.
func TestDenyListAsLastRead(t *testing.T) {
	peer := func(serial int64) transport.PeerInfo {
		return transport.PeerInfo{Role: transport.RoleAdmin, Name: "alice", Cert: &x509.Certificate{SerialNumber: big.NewInt(serial)}}
	}
	ids := &denyStore{revoked: map[string]*api.Revocation{"2": {Serial: "2", RevokedBy: "bob", Reason: "left"}}}
	var l lastRead
	if err := l.checkDenyList(ids, peer(1)); err != nil {
		t.Fatalf("a certificate not revoked: %v", err)
	}
	if err := l.checkDenyList(ids, peer(2)); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked certificate: %v", err)
	}
	ids.away = true
	if err := l.checkDenyList(ids, peer(1)); err != nil {
		t.Errorf("while the store is away a certificate admitted before is refused: %v", err)
	}
	if err := l.checkDenyList(ids, peer(2)); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("while the store is away a revoked certificate: %v", err)
	}
	if err := l.checkDenyList(ids, peer(3)); err == nil || !strings.Contains(err.Error(), "has not checked it before") {
		t.Errorf("while the store is away a certificate never checked: %v", err)
	}
}
