package nvml

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
)

// Hang stops the rank on GPU gpu where it is told (workload/include/simhang.h):
// "inside" a collective (the reference libnccl never returns from it),
// "outside" one (ringtrain waits between steps), or "" to let it go. The
// rank reads $KernelDir/hang-<gpu>, so a hang needs KernelDir; the file
// is replaced by rename, so a rank never reads half of it.
func (s *Sim) Hang(gpu int, where string) error {
	if err := s.checkGPU(gpu); err != nil {
		return fmt.Errorf("hang: %w", err)
	}
	if s.opts.KernelDir == "" {
		if where == "" {
			return nil // no rank could have been hung
		}
		return errors.New("hang: this simulated host has no kernel dir for its ranks to read a hang from (nodemon --sim sets one)")
	}
	path := filepath.Join(s.opts.KernelDir, "hang-"+strconv.Itoa(gpu))
	switch where {
	case "":
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("clear hang on GPU %d: %w", gpu, err)
		}
		return nil
	case "inside", "outside":
	default:
		return fmt.Errorf("hang on GPU %d: where is %q; use inside or outside", gpu, where)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(where+"\n"), 0o644); err != nil {
		return fmt.Errorf("hang on GPU %d: %w", gpu, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("hang on GPU %d: %w", gpu, err)
	}
	s.log.Info("hang injected", "gpu", gpu, "where", where)
	return nil
}
