package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
	"time"
)

// maxLogLine bounds the partial line the parser keeps; a longer line is
// skipped up to its newline (no progress line is that long).
const maxLogLine = 64 << 10

// maxTailRead bounds what one poll reads of a log, so a rank that floods
// its output cannot stall the sampler; the rest is read on later polls.
const maxTailRead = 8 << 20

// logParser picks progress lines out of a rank's output, which arrives in
// arbitrary chunks:
//
//	step N loss=F state=HEX step_ms=F
//	checkpoint step=N bytes=B seconds=F
type logParser struct {
	partial  []byte
	skipping bool // inside a line longer than maxLogLine

	step        int64
	stepAt      time.Time
	lastCkpt    int64
	ckptSeconds map[int64]float64 // checkpoint step → seconds, not yet reported
}

func newLogParser() *logParser {
	return &logParser{step: -1, lastCkpt: -1, ckptSeconds: map[int64]float64{}}
}

// feed parses a chunk of output read at now.
func (p *logParser) feed(b []byte, now time.Time) {
	for len(b) > 0 {
		nl := bytes.IndexByte(b, '\n')
		if nl < 0 {
			if !p.skipping {
				p.partial = append(p.partial, b...)
				if len(p.partial) > maxLogLine {
					p.partial, p.skipping = p.partial[:0], true
				}
			}
			return
		}
		if p.skipping {
			p.skipping = false
		} else if len(p.partial) > 0 {
			p.partial = append(p.partial, b[:nl]...)
			p.line(p.partial, now)
			p.partial = p.partial[:0]
		} else {
			p.line(b[:nl], now)
		}
		b = b[nl+1:]
	}
}

func (p *logParser) line(l []byte, now time.Time) {
	l = bytes.TrimRight(l, "\r")
	switch {
	case bytes.HasPrefix(l, []byte("step ")):
		f := bytes.Fields(l[len("step "):])
		if len(f) == 0 {
			return
		}
		if n, err := strconv.ParseInt(string(f[0]), 10, 64); err == nil && n >= 0 {
			p.step, p.stepAt = n, now
		}
	case bytes.HasPrefix(l, []byte("checkpoint ")):
		kv := lineFields(l[len("checkpoint "):])
		n, err := strconv.ParseInt(kv["step"], 10, 64)
		if err != nil || n < 0 {
			return
		}
		secs, err := strconv.ParseFloat(kv["seconds"], 64)
		if err != nil || secs < 0 || secs != secs {
			secs = 0
		}
		if n > p.lastCkpt {
			p.lastCkpt = n
		}
		// Bounded: the watcher forgets steps it reported; a rank that is not
		// its job's reporter keeps only the newest ones.
		if _, ok := p.ckptSeconds[n]; !ok && len(p.ckptSeconds) >= 64 {
			oldest := n
			for s := range p.ckptSeconds {
				oldest = min(oldest, s)
			}
			delete(p.ckptSeconds, oldest)
		}
		p.ckptSeconds[n] = secs
	}
}

// lineFields splits "k=v k=v" into a map; words without '=' are ignored.
func lineFields(b []byte) map[string]string {
	out := map[string]string{}
	for _, f := range bytes.Fields(b) {
		if k, v, ok := bytes.Cut(f, []byte("=")); ok {
			out[string(k)] = string(v)
		}
	}
	return out
}

// logTail reads a rank's log incrementally: each poll reads only what was
// appended since the last one, and follows the file across rotation (the
// path names a new file) and truncation (the file shrank).
type logTail struct {
	path string
	f    *os.File
	ino  uint64
	off  int64
	buf  []byte
}

// openLogTail starts following path from its current end, so lines a
// previous attempt left in the same file are not taken for this one's.
func openLogTail(path string) *logTail {
	t := &logTail{path: path}
	if f, ino, size, err := openIno(path); err == nil {
		t.f, t.ino, t.off = f, ino, size
	}
	return t
}

func openIno(path string) (*os.File, uint64, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, 0, err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if st == nil {
		f.Close()
		return nil, 0, 0, errors.New("no inode number")
	}
	return f, st.Ino, fi.Size(), nil
}

// chunkSink takes a log's output as it is read, in arbitrary chunks.
type chunkSink interface {
	feed(b []byte, now time.Time)
}

// poll feeds what was appended since the last poll to p.
func (t *logTail) poll(p chunkSink, now time.Time) error {
	budget := int64(maxTailRead)
	if t.f != nil {
		n, err := t.drain(p, now, budget)
		budget -= n
		if err != nil {
			return err
		}
	}
	if budget <= 0 {
		return nil
	}
	fi, err := os.Stat(t.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // between rotation's rename and the new file
		}
		return fmt.Errorf("tail %s: %w", t.path, err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case t.f == nil || st == nil || st.Ino != t.ino:
		// Rotated (or first seen): the old file was read to its end above;
		// the new one is read from its start.
		f, ino, _, err := openIno(t.path)
		if err != nil {
			return nil
		}
		if t.f != nil {
			t.f.Close()
		}
		t.f, t.ino, t.off = f, ino, 0
		_, err = t.drain(p, now, budget)
		return err
	case fi.Size() < t.off:
		// Truncated in place: what is there now is new.
		t.off = 0
		_, err := t.drain(p, now, budget)
		return err
	}
	return nil
}

func (t *logTail) drain(p chunkSink, now time.Time, budget int64) (int64, error) {
	if t.buf == nil {
		t.buf = make([]byte, 64<<10)
	}
	var total int64
	for total < budget {
		n, err := t.f.ReadAt(t.buf, t.off)
		if n > 0 {
			p.feed(t.buf[:n], now)
			t.off += int64(n)
			total += int64(n)
		}
		if err == io.EOF || n == 0 {
			return total, nil
		}
		if err != nil {
			return total, fmt.Errorf("tail %s: %w", t.path, err)
		}
	}
	return total, nil
}

func (t *logTail) close() {
	if t.f != nil {
		t.f.Close()
		t.f = nil
	}
}

// adoptWindow is how much of an adopted rank's log is read back.
const adoptWindow = 256 << 10

// catchUp parses the end of the log for a rank adopted after a nodemon
// restart, from the shim's start line for pid if it is in the last
// adoptWindow bytes: what the rank printed while no nodemon read the log
// (its last step, checkpoints not yet reported) is not lost, and what an
// earlier attempt printed into the same file is not taken for its own.
func (t *logTail) catchUp(p *logParser, pid int, now time.Time) error {
	if t.f == nil {
		return nil
	}
	start := max(0, t.off-adoptWindow)
	buf := make([]byte, t.off-start)
	n, err := t.f.ReadAt(buf, start)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("tail %s: %w", t.path, err)
	}
	buf = buf[:n]
	from := -1
	if i := bytes.LastIndex(buf, fmt.Appendf(nil, ") started: pid %d:", pid)); i >= 0 {
		from = i
	} else if start > 0 {
		from = 0 // the window starts inside a line
	}
	if from >= 0 {
		nl := bytes.IndexByte(buf[from:], '\n')
		if nl < 0 {
			return nil
		}
		buf = buf[from+nl+1:]
	}
	p.feed(buf, now)
	return nil
}
