// Package procfs reads what gpuctl needs of a process from the Linux proc
// filesystem: its state, CPU time, start time and resident memory.
package procfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ClockTicks is USER_HZ, the unit of the times in /proc/PID/stat. The
// kernel fixes it at 100 on every architecture Linux exposes it for.
const ClockTicks = 100

// ErrNoProcess says the pid names no process (any more).
var ErrNoProcess = errors.New("no such process")

// Stat is what gpuctl reads of one process from /proc/PID/stat.
type Stat struct {
	PID   int
	State string // R, S, D, T, t, Z, X, I …
	PPID  int
	PGRP  int
	// UTime and STime are CPU time in clock ticks; StartTicks is when the
	// process started, in clock ticks after boot: with the pid it names one
	// process for good, since a reused pid starts later.
	UTime, STime, StartTicks uint64
	// RSSPages is the resident set in pages (0 for a kernel thread).
	RSSPages uint64
}

// CPUSeconds is the CPU time the process has used.
func (s Stat) CPUSeconds() float64 { return float64(s.UTime+s.STime) / ClockTicks }

// Exited reports a process that has exited but whose parent has not
// collected it yet (zombie or dead).
func (s Stat) Exited() bool { return s.State == "Z" || s.State == "X" }

// ReadStat reads /proc/PID/stat under root (normally /proc). A pid that
// names no process gives an error wrapping ErrNoProcess.
func ReadStat(root string, pid int) (Stat, error) {
	b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "stat"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Stat{}, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return Stat{}, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	return ParseStat(b)
}

// ParseStat parses the text of /proc/PID/stat. The command name sits in
// parentheses and may itself hold spaces and parentheses, so the fields
// are counted from the last ')'.
func ParseStat(b []byte) (Stat, error) {
	open := bytes.IndexByte(b, '(')
	end := bytes.LastIndexByte(b, ')')
	if open < 1 || end < open {
		return Stat{}, fmt.Errorf("parse /proc stat %.40q: no (comm)", b)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil || pid <= 0 {
		return Stat{}, fmt.Errorf("parse /proc stat %.40q: bad pid", b)
	}
	f := bytes.Fields(b[end+1:])
	// f[0] is field 3 (state) of proc(5); rss is field 24.
	if len(f) < 22 {
		return Stat{}, fmt.Errorf("parse /proc stat of pid %d: %d fields after the name, want at least 22", pid, len(f))
	}
	s := Stat{PID: pid, State: string(f[0])}
	if c := s.State; len(c) != 1 || !('A' <= c[0] && c[0] <= 'Z' || 'a' <= c[0] && c[0] <= 'z') {
		return Stat{}, fmt.Errorf("parse /proc stat of pid %d: state %q is not one letter", pid, s.State)
	}
	for _, v := range []struct {
		i   int
		dst *int
	}{{1, &s.PPID}, {2, &s.PGRP}} {
		if *v.dst, err = strconv.Atoi(string(f[v.i])); err != nil {
			return Stat{}, fmt.Errorf("parse /proc stat of pid %d: field %d: %w", pid, v.i+3, err)
		}
	}
	for _, v := range []struct {
		i   int
		dst *uint64
	}{{11, &s.UTime}, {12, &s.STime}, {19, &s.StartTicks}} {
		if *v.dst, err = strconv.ParseUint(string(f[v.i]), 10, 64); err != nil {
			return Stat{}, fmt.Errorf("parse /proc stat of pid %d: field %d: %w", pid, v.i+3, err)
		}
	}
	rss, err := strconv.ParseInt(string(f[21]), 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("parse /proc stat of pid %d: field 24 (rss): %w", pid, err)
	}
	if rss > 0 {
		s.RSSPages = uint64(rss)
	}
	return s, nil
}
