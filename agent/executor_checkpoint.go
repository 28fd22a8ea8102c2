package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// checkCheckpoint reports the checkpoints of job completed since the last
// report: every step rank 0 printed a checkpoint line for up to the
// marker, and the marker's own step. final says rank 0 has exited, so its
// log is complete and nothing is worth waiting for.
func (x *Executor) checkCheckpoint(job string, w *ckptWatch, p0 *rankProc, now time.Time, final bool) {
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
	secs := maps.Clone(p0.parser.ckptSeconds)
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
		p0.rec.CheckpointReported = w.reported
		x.pass.save = true
	}()
	for _, s := range steps {
		sec, ok := secs[s]
		if !ok && !final && now.Sub(w.noticed[marker]) < ckptLineGrace {
			return
		}
		stepDir := filepath.Join(w.dir, "step-"+strconv.FormatInt(s, 10))
		size := dirSize(stepDir)
		x.raise(&api.Event{
			TimeUnixNano: now.UnixNano(), Kind: api.EventKind_EVENT_KIND_CHECKPOINT, Severity: api.Severity_SEVERITY_INFO,
			Job: job, Rank: 0, Step: s, Bytes: size, Seconds: sec,
			Attrs:   map[string]string{"dir": stepDir, "attempt": strconv.Itoa(int(p0.rec.Attempt))},
			Message: fmt.Sprintf("checkpoint of job %s at step %d completed: %d bytes in %.3fs", job, s, size, sec),
		})
		x.log.Info("checkpoint completed", "job", job, "step", s, "bytes", size, "seconds", sec)
		w.reported = s
		for k := range p0.parser.ckptSeconds {
			if k <= s {
				delete(p0.parser.ckptSeconds, k)
			}
		}
	}
	clear(w.noticed)
}
