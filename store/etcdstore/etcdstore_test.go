package etcdstore

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/gpuctl/gpuctl/internal/etcdtest"
	"github.com/gpuctl/gpuctl/store/storetest"
)

var prefixes atomic.Int64

// openFenced opens a store under a prefix of its own and fences it under
// a leadership key it creates itself (what an election would hand over).
func openFenced(t testing.TB, cli *clientv3.Client, opts Options) *Store {
	t.Helper()
	if opts.Prefix == "" {
		opts.Prefix = fmt.Sprintf("/t%d/", prefixes.Add(1))
	}
	s, err := Open(context.Background(), cli, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	// A fresh creation revision, as a new election key would have.
	if _, err := cli.Delete(context.Background(), opts.Prefix+"leader"); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Put(context.Background(), opts.Prefix+"leader", "me")
	if err != nil {
		t.Fatal(err)
	}
	s.Fence(opts.Prefix+"leader", resp.Header.Revision)
	return s
}

func TestConformance(t *testing.T) {
	c := etcdtest.Start(t, 3)
	cli := c.Client(t)
	storetest.Run(t, func(t *testing.T) storetest.Store { return openFenced(t, cli, Options{}) })
}
