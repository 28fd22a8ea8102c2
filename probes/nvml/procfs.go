package nvml

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/gpuctl/gpuctl/procfs"
)

// errZombie marks a process that has exited but not been reaped.
var errZombie = errors.New("process has exited")

// procIO is what the simulated host reads from /proc/<pid>/io.
type procIO struct {
	rchar, wchar          uint64 // bytes through read/write syscalls, sockets included
	readBytes, writeBytes uint64 // bytes fetched from or sent to storage
}

// parseIO decodes the content of /proc/<pid>/io ("key: value" lines).
// Unknown keys are ignored; a malformed known key is an error.
func parseIO(b []byte) (procIO, error) {
	var pio procIO
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
			return pio, fmt.Errorf("io: line %q has no ':'", line)
		}
		var dst *uint64
		switch string(bytes.TrimSpace(k)) {
		case "rchar":
			dst = &pio.rchar
		case "wchar":
			dst = &pio.wchar
		case "read_bytes":
			dst = &pio.readBytes
		case "write_bytes":
			dst = &pio.writeBytes
		default:
			continue
		}
		n, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
		if err != nil {
			return pio, fmt.Errorf("io: %s: %w", k, err)
		}
		*dst = n
	}
	return pio, nil
}

// readProc reads /proc/<pid>/stat and, where permitted, /proc/<pid>/io.
// ioOK is false when the io file could not be read (another user's process).
func readProc(root string, pid uint32, buf []byte) (st procfs.Stat, pio procIO, ioOK bool, err error) {
	dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
	b, err := readInto(filepath.Join(dir, "stat"), buf)
	if err != nil {
		return st, pio, false, err
	}
	if st, err = procfs.ParseStat(b); err != nil {
		return st, pio, false, fmt.Errorf("pid %d: %w", pid, err)
	}
	if st.Exited() {
		return st, pio, false, errZombie
	}
	b, err = readInto(filepath.Join(dir, "io"), buf)
	if err != nil {
		return st, pio, false, nil
	}
	pio, err = parseIO(b)
	return st, pio, err == nil, nil
}

// readInto reads a small proc file into buf, growing it only if needed.
// Plain syscalls: os.Open's poller bookkeeping costs more than the read.
func readInto(path string, buf []byte) ([]byte, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(fd)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf)+512)...)
		}
		m, err := syscall.Read(fd, buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

// readComm returns the command name of pid, "" if it cannot be read.
func readComm(root string, pid uint32) string {
	b, err := os.ReadFile(filepath.Join(root, strconv.FormatUint(uint64(pid), 10), "comm"))
	if err != nil {
		return ""
	}
	return string(bytes.TrimRight(b, "\n"))
}
