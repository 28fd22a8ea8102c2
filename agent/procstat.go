package agent

import "github.com/gpuctl/gpuctl/procfs"

// processAlive reports whether pid is still the process that started at
// startTicks and has not exited (a zombie has exited; only its parent has
// not collected it yet).
func processAlive(root string, pid int, startTicks uint64) bool {
	if pid <= 0 {
		return false
	}
	s, err := procfs.ReadStat(root, pid)
	if err != nil {
		return false
	}
	return s.StartTicks == startTicks && !s.Exited()
}
