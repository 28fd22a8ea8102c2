package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gpuctl/gpuctl/api"
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
type ckptWatch struct {
	dir string

	mu       sync.Mutex
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

// checkCheckpoint reports the checkpoints of job completed since the last
// report: every step rank 0 printed a checkpoint line for up to the
// marker, and the marker's own step. final says rank 0 has exited, so its
// log is complete and nothing is worth waiting for.
func (x *Executor) checkCheckpoint(job string, w *ckptWatch, p0 *rankProc, now time.Time, final bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, err := parseMarker(w.dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			x.log.Debug("read checkpoint marker", "job", job, "err", err)
		}
		return
	}
	if m.attempt > p0.rec.Attempt {
		// A newer attempt (elsewhere) committed it: not this rank's to report.
		return
	}
	marker := m.step
	if marker <= w.reported {
		return
	}
	p0.pollLog(now)
	p0.mu.Lock()
	secs := map[int64]float64{}
	for s, v := range p0.parser.ckptSeconds {
		secs[s] = v
	}
	p0.mu.Unlock()
	steps := []int64{marker}
	for s := range secs {
		if s > w.reported && s < marker {
			steps = append(steps, s)
		}
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	if _, ok := w.noticed[marker]; !ok {
		w.noticed[marker] = now
	}
	before := w.reported
	defer func() {
		if w.reported == before {
			return
		}
		x.mu.Lock()
		p0.rec.CheckpointReported = w.reported
		x.saveLocked()
		x.mu.Unlock()
	}()
	for _, s := range steps {
		sec, ok := secs[s]
		if !ok && !final && now.Sub(w.noticed[marker]) < ckptLineGrace {
			return
		}
		stepDir := filepath.Join(w.dir, "step-"+strconv.FormatInt(s, 10))
		size := dirSize(stepDir)
		x.opts.OnEvent(&api.Event{
			TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Severity: api.Severity_SEVERITY_INFO,
			Job: job, Rank: 0, Step: s, Bytes: size, Seconds: sec,
			Attrs:   map[string]string{"dir": stepDir, "attempt": strconv.Itoa(int(p0.rec.Attempt))},
			Message: fmt.Sprintf("checkpoint of job %s at step %d completed: %d bytes in %.3fs", job, s, size, sec),
		})
		x.log.Info("checkpoint completed", "job", job, "step", s, "bytes", size, "seconds", sec)
		w.reported = s
		p0.mu.Lock()
		for k := range p0.parser.ckptSeconds {
			if k <= s {
				delete(p0.parser.ckptSeconds, k)
			}
		}
		p0.mu.Unlock()
	}
	clear(w.noticed)
}
