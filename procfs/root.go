package procfs

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// FileOf is where a path as process pid sees it (a library it mapped) is
// on this host. A container's root is usually an overlay: the file is
// looked up in its upper, then lower directories, so that the same file
// of an image reads as the same file whichever container maps it (a
// uprobe attached through each container's overlay would fire once per
// container for every call). Otherwise it is the path under
// /proc/PID/root, which reaches the process's own mount namespace.
func FileOf(root string, pid int, path string) string {
	if f, err := os.Open(filepath.Join(root, strconv.Itoa(pid), "mountinfo")); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			if real, ok := overlayFile(sc.Text(), path); ok {
				return real
			}
		}
	}
	return filepath.Join(root, strconv.Itoa(pid), "root", path)
}

// overlayFile finds path in the layers of a mountinfo line that mounts an
// overlay at "/" (proc(5): fields, " - ", fstype, source, super options).
func overlayFile(line, path string) (string, bool) {
	pre, post, ok := strings.Cut(line, " - ")
	fields, tail := strings.Fields(pre), strings.Fields(post)
	if !ok || len(fields) < 5 || fields[4] != "/" || len(tail) < 3 || tail[0] != "overlay" {
		return "", false
	}
	var dirs []string
	for _, opt := range strings.Split(tail[2], ",") {
		switch k, v, _ := strings.Cut(opt, "="); k {
		case "upperdir":
			dirs = append([]string{v}, dirs...)
		case "lowerdir":
			dirs = append(dirs, strings.Split(v, ":")...)
		}
	}
	for _, d := range dirs {
		p := filepath.Join(unescape(d), path)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
