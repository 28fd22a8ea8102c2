package agent

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"syscall"
)

// Rank log rotation defaults: 64 MiB per file, three rotated files kept
// (rank-R.log.1 newest … rank-R.log.3 oldest).
const (
	DefaultLogMaxBytes = 64 << 20
	DefaultLogKeep     = 3
)

// rotatingWriter appends to a log file and rotates it by size. The rank
// shim owns it: the rank writes into a pipe, so rotation never races with
// the rank's own file offset (copytruncate would lose what the rank writes
// between the copy and the truncate).
type rotatingWriter struct {
	mu   sync.Mutex
	path string
	max  int64
	keep int
	f    *os.File
	size int64
	err  error // last write error, reported once
	// owner is the job's account, which every log file is made over to;
	// nil keeps the shim's own.
	owner *syscall.Credential
}

func openRotating(path string, max int64, keep int, owner *syscall.Credential) (*rotatingWriter, error) {
	if max <= 0 {
		return nil, fmt.Errorf("log rotation size %d: want more than 0 bytes", max)
	}
	if keep < 0 {
		return nil, fmt.Errorf("log rotation keep %d: want 0 or more files", keep)
	}
	w := &rotatingWriter{path: path, max: max, keep: keep, owner: owner}
	if err := w.open(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *rotatingWriter) open() error {
	f, err := openRankLog(w.path, w.owner)
	if err != nil {
		return err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("open rank log: %w", err)
	}
	w.f, w.size = f, fi.Size()
	return nil
}

// Write appends p. A file never grows past max: p is cut at the last
// newline that fits, the rest goes to a new file after rotation (a line
// longer than max is cut at max). Write never fails: a log that cannot be
// written must not block or kill the rank, so the error is kept for Err
// and the bytes are dropped.
func (w *rotatingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		if w.f == nil {
			if err := w.open(); err != nil {
				w.err = err
				return n, nil
			}
		}
		room := w.max - w.size
		if int64(len(p)) <= room {
			w.write(p)
			break
		}
		cut := 0
		if room > 0 {
			cut = bytes.LastIndexByte(p[:room], '\n') + 1
		}
		switch {
		case cut > 0:
			w.write(p[:cut])
			p = p[cut:]
		case w.size == 0:
			w.write(p[:room])
			p = p[room:]
		}
		if err := w.rotate(); err != nil {
			w.err = err
			return n, nil
		}
	}
	return n, nil
}

func (w *rotatingWriter) write(p []byte) {
	n, err := w.f.Write(p)
	w.size += int64(n)
	if err != nil {
		w.err = fmt.Errorf("write rank log: %w", err)
	}
}

// Rank logs hold what a job printed, which may be private to its user:
// they are the job's account's, readable by its group, and no one
// else's, in a directory of the same.
const (
	rankLogMode    os.FileMode = 0o640
	rankLogDirMode os.FileMode = 0o750
)

// openRankLog opens (creating) a rank log for appending, with
// rankLogMode and owned by owner when given. A file left by an older
// nodemon with a wider mode is narrowed.
func openRankLog(path string, owner *syscall.Credential) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, rankLogMode)
	if err != nil {
		return nil, fmt.Errorf("open rank log: %w", err)
	}
	if err := f.Chmod(rankLogMode); err != nil {
		f.Close()
		return nil, fmt.Errorf("open rank log %s: %w", path, err)
	}
	if owner != nil {
		if err := f.Chown(int(owner.Uid), int(owner.Gid)); err != nil {
			f.Close()
			return nil, fmt.Errorf("open rank log %s: give it to uid %d: %w", path, owner.Uid, err)
		}
	}
	return f, nil
}

// rankLogDir makes dir, a job's log directory, with rankLogDirMode and
// owned by owner when given.
func rankLogDir(dir string, owner *syscall.Credential) error {
	if err := os.MkdirAll(dir, rankLogDirMode); err != nil {
		return err
	}
	if err := os.Chmod(dir, rankLogDirMode); err != nil {
		return err
	}
	if owner != nil {
		if err := os.Chown(dir, int(owner.Uid), int(owner.Gid)); err != nil {
			return fmt.Errorf("give %s to uid %d: %w", dir, owner.Uid, err)
		}
	}
	return nil
}

// rotate shifts path.N to path.N+1 (dropping the oldest), path to path.1,
// and starts a new path.
func (w *rotatingWriter) rotate() error {
	w.f.Close()
	w.f = nil
	if w.keep == 0 {
		if err := os.Truncate(w.path, 0); err != nil {
			return fmt.Errorf("rotate rank log: %w", err)
		}
		return w.open()
	}
	os.Remove(fmt.Sprintf("%s.%d", w.path, w.keep))
	for i := w.keep - 1; i >= 1; i-- {
		os.Rename(fmt.Sprintf("%s.%d", w.path, i), fmt.Sprintf("%s.%d", w.path, i+1))
	}
	if err := os.Rename(w.path, w.path+".1"); err != nil {
		return fmt.Errorf("rotate rank log: %w", err)
	}
	return w.open()
}

// Err returns the last error the writer swallowed.
func (w *rotatingWriter) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *rotatingWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return nil
	}
	err := w.f.Close()
	w.f = nil
	return err
}
