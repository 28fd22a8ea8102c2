package store_test

import (
	"path/filepath"
	"testing"

	"github.com/gpuctl/gpuctl/store"
	"github.com/gpuctl/gpuctl/store/storetest"
)

func TestBoltConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Store {
		s, err := store.OpenBolt(filepath.Join(t.TempDir(), "state.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}
