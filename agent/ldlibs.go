package agent

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// systemLibDirs are searched after RUNPATH and LD_LIBRARY_PATH, in the
// order of Debian's and NVIDIA's usual layouts.
var systemLibDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
	"/usr/local/cuda/lib64", "/usr/local/nccl/lib",
}

// neededNCCL returns the paths of the libnccl.so* libraries the program
// exe links directly, resolved the way the dynamic loader would (RPATH,
// LD_LIBRARY_PATH, RUNPATH, then the system directories). nodemon attaches
// its probes to them before the ranks start, so not even a rank's first
// call goes untraced. A program that does not link NCCL (a Python
// interpreter loading it later, say) gives none; periodic scanning of
// /proc/*/maps finds those.
func neededNCCL(exe, ldLibraryPath string) ([]string, error) {
	f, err := elf.Open(exe)
	if err != nil {
		var fe *elf.FormatError
		if errors.As(err, &fe) {
			return nil, nil // a script: nothing to resolve statically
		}
		return nil, fmt.Errorf("read %s: %w", exe, err)
	}
	defer f.Close()
	needed, err := f.ImportedLibraries()
	if err != nil {
		return nil, nil // statically linked
	}
	origin := filepath.Dir(exe)
	expand := func(list []string) []string {
		var out []string
		for _, l := range list {
			for _, d := range strings.Split(l, ":") {
				if d != "" {
					out = append(out, strings.NewReplacer("$ORIGIN", origin, "${ORIGIN}", origin).Replace(d))
				}
			}
		}
		return out
	}
	rpath, _ := f.DynString(elf.DT_RPATH)
	runpath, _ := f.DynString(elf.DT_RUNPATH)
	var dirs []string
	if len(runpath) == 0 {
		dirs = append(dirs, expand(rpath)...)
	}
	dirs = append(dirs, expand([]string{ldLibraryPath})...)
	dirs = append(dirs, expand(runpath)...)
	dirs = append(dirs, systemLibDirs...)
	var out []string
	for _, lib := range needed {
		if !strings.HasPrefix(lib, "libnccl.so") {
			continue
		}
		for _, d := range dirs {
			p := filepath.Join(d, lib)
			if _, err := os.Stat(p); err == nil {
				out = append(out, p)
				break
			}
		}
	}
	return out, nil
}
