package sshserve

import (
	"runtime"
	"testing"
	"time"
)

// TestSSHHugeTerminal opens sessions on 1000×1000 and 2000×2000 PTYs:
// each is drawn at 500×200 and says so, and four of them cost the server
// tens of MB, not the hundreds an uncapped renderer holds.
func TestSSHHugeTerminal(t *testing.T) {
	c := startConsole(t)
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	before := heap()
	for i, size := range []int{1000, 2000, 1000, 1500} {
		scr := openSessionSized(t, c.addr, c.operator, size, size).out
		scr.waitFor(t, "alice@ssh (operator)", 15*time.Second)
		if i == 0 {
			scr.waitFor(t, "drawing 500×200", 5*time.Second)
		}
	}
	grew := int64(heap()) - int64(before)
	t.Logf("4 sessions on PTYs of 1000² to 2000²: server heap in use grew %.1f MB", float64(grew)/(1<<20))
	if grew > 200<<20 {
		t.Errorf("4 huge-PTY sessions grew the heap by %d MB, want it capped", grew>>20)
	}
}
