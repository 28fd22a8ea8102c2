package agent

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ckptLineGrace is how long a watcher waits, after the `latest` marker
// moved, for rank 0's `checkpoint step=N … seconds=S` line (the rank
// prints it just after writing the marker) before reporting without the
// seconds.
const ckptLineGrace = 3 * time.Second

// ckptWatch follows one job's checkpoint directory.
//
// Which node reports: the one that runs the job's rank 0. The directory
// may be shared by every node of the job, and rank 0 is the rank that
// writes the `latest` marker, so exactly one node reports each checkpoint,
// and a node-local directory holds a marker only on rank 0's node anyway.
// It belongs to the executor's owner goroutine.
type ckptWatch struct {
	dir      string
	reported int64               // last step reported, or the marker when watching began; -1 none
	noticed  map[int64]time.Time // marker steps seen whose log line has not come yet
}

func newCkptWatch(dir string, reported int64) *ckptWatch {
	return &ckptWatch{dir: dir, reported: reported, noticed: map[int64]time.Time{}}
}

// marker is a checkpoint directory's `latest` marker: `N` or, written
// by an attempt that knows its epoch, `N attempt=A`. A commit from an
// attempt older than the marker's is refused by the writer (ringtrain), so
// a stale rank cannot move the marker over a newer attempt's checkpoint.
type marker struct {
	step int64
	// attempt is the attempt that committed the step; 0: not recorded.
	attempt uint32
}

// readMarker returns the step in dir/latest, or -1 when there is none.
func readMarker(dir string) int64 {
	m, err := parseMarker(dir)
	if err != nil {
		return -1
	}
	return m.step
}

// parseMarker reads dir/latest. This is the one place gpuctl parses it.
func parseMarker(dir string) (marker, error) {
	path := filepath.Join(dir, "latest")
	b, err := os.ReadFile(path)
	if err != nil {
		return marker{step: -1}, err
	}
	m, err := parseMarkerText(b)
	if err != nil {
		return m, fmt.Errorf("checkpoint marker %s: %w", path, err)
	}
	return m, nil
}

func parseMarkerText(b []byte) (marker, error) {
	bad := func() (marker, error) {
		return marker{step: -1}, fmt.Errorf("%q is not `STEP` or `STEP attempt=N`", b)
	}
	fields := strings.Fields(string(b))
	if len(fields) == 0 || len(fields) > 2 {
		return bad()
	}
	if c := fields[0][0]; c < '0' || c > '9' {
		return bad() // no sign: ringtrain reads it as it is written
	}
	n, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil || n < 0 {
		return bad()
	}
	m := marker{step: n}
	if len(fields) == 2 {
		v, ok := strings.CutPrefix(fields[1], "attempt=")
		a, err := strconv.ParseUint(v, 10, 32)
		if !ok || err != nil || a == 0 {
			return bad()
		}
		m.attempt = uint32(a)
	}
	return m, nil
}

// dirSize is the bytes of the regular files under dir.
func dirSize(dir string) uint64 {
	var total uint64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			total += uint64(fi.Size())
		}
		return nil
	})
	return total
}
