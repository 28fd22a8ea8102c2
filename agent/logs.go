package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gpuctl/gpuctl/api"
)

// MaxReadLogsBytes caps one ReadLogs answer, so a log read never crowds
// the control stream.
const MaxReadLogsBytes = 1 << 20

// ReadLogs reads part of a rank's current log (rank-R.log, not the
// rotated files): up to max_bytes (0 or more than 1 MiB means 1 MiB) from
// offset, or from that many bytes before the end when offset is negative.
// It returns the bytes and the offset just past them, which a follower
// passes back in its next read. An offset past the end (the log was
// rotated since) returns nothing and the current end.
func (x *Executor) ReadLogs(r *api.ReadLogs) ([]byte, int64, error) {
	if err := validJobName(r.GetJob()); err != nil {
		return nil, 0, fmt.Errorf("read logs: %w", err)
	}
	path := filepath.Join(x.logDir, r.GetJob(), fmt.Sprintf("rank-%d.log", r.GetRank()))
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("read logs: job %q has no rank %d on node %s (no log at %s)", r.GetJob(), r.GetRank(), x.opts.Node, path)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("read logs of job %s rank %d: %w", r.GetJob(), r.GetRank(), err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, fmt.Errorf("read logs of job %s rank %d: %w", r.GetJob(), r.GetRank(), err)
	}
	return readRange(f, fi.Size(), r.GetOffset(), r.GetMaxBytes())
}

// readRange reads up to maxBytes of a file of the given size from off
// (negative: from the end).
func readRange(f io.ReaderAt, size, off int64, maxBytes uint32) ([]byte, int64, error) {
	n := int64(maxBytes)
	if n == 0 || n > MaxReadLogsBytes {
		n = MaxReadLogsBytes
	}
	if off < 0 {
		off = max(0, size+off)
	}
	if off >= size {
		return nil, size, nil
	}
	n = min(n, size-off)
	buf := make([]byte, n)
	got, err := f.ReadAt(buf, off)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, off, fmt.Errorf("read logs at offset %d: %w", off, err)
	}
	return buf[:got], off + int64(got), nil
}
