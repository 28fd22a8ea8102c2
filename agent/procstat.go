package agent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// clockTicks is USER_HZ, the unit of the times in /proc/PID/stat. The
// kernel fixes it at 100 on every architecture Linux exposes it for.
const clockTicks = 100

// procStat is what nodemon reads of one process from /proc/PID/stat.
type procStat struct {
	PID   int
	State string // R, S, D, T, t, Z, X, I …
	PPID  int
	PGRP  int
	// UTime and STime are CPU time in clock ticks; StartTicks is when the
	// process started, in clock ticks after boot: with the pid it names one
	// process for good, since a reused pid starts later.
	UTime, STime, StartTicks uint64
}

// CPUSeconds is the CPU time the process has used.
func (s procStat) CPUSeconds() float64 { return float64(s.UTime+s.STime) / clockTicks }

// errNoProcess says the pid names no process (any more).
var errNoProcess = errors.New("no such process")

// readProcStat reads /proc/PID/stat under root (normally /proc).
func readProcStat(root string, pid int) (procStat, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return procStat{}, fmt.Errorf("pid %d: %w", pid, errNoProcess)
		}
		return procStat{}, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	return parseProcStat(b)
}

// parseProcStat parses the text of /proc/PID/stat. The command name sits
// in parentheses and may itself hold spaces and parentheses, so the fields
// are counted from the last ')'.
func parseProcStat(b []byte) (procStat, error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return procStat{}, fmt.Errorf("parse /proc stat %.40q: no (comm)", b)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil || pid <= 0 {
		return procStat{}, fmt.Errorf("parse /proc stat %.40q: bad pid", b)
	}
	f := bytes.Fields(b[end+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return procStat{}, fmt.Errorf("parse /proc stat of pid %d: %d fields after the name, want at least 20", pid, len(f))
	}
	s := procStat{PID: pid, State: string(f[0])}
	ints := []struct {
		i   int
		dst *int
	}{{1, &s.PPID}, {2, &s.PGRP}}
	for _, v := range ints {
		if *v.dst, err = strconv.Atoi(string(f[v.i])); err != nil {
			return procStat{}, fmt.Errorf("parse /proc stat of pid %d: field %d: %w", pid, v.i+3, err)
		}
	}
	uints := []struct {
		i   int
		dst *uint64
	}{{11, &s.UTime}, {12, &s.STime}, {19, &s.StartTicks}}
	for _, v := range uints {
		if *v.dst, err = strconv.ParseUint(string(f[v.i]), 10, 64); err != nil {
			return procStat{}, fmt.Errorf("parse /proc stat of pid %d: field %d: %w", pid, v.i+3, err)
		}
	}
	if len(s.State) != 1 {
		return procStat{}, fmt.Errorf("parse /proc stat of pid %d: state %q is not one letter", pid, s.State)
	}
	return s, nil
}

// processAlive reports whether pid is still the process that started at
// startTicks and has not exited (a zombie has exited; only its parent has
// not collected it yet).
func processAlive(root string, pid int, startTicks uint64) bool {
	if pid <= 0 {
		return false
	}
	s, err := readProcStat(root, pid)
	if err != nil {
		return false
	}
	return s.StartTicks == startTicks && s.State != "Z" && s.State != "X"
}
