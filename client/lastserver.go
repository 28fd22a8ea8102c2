package client

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// CacheDir is where gpuctl keeps what it may lose: the console's log and
// the server of a control plane that last answered. It is
// $XDG_CACHE_HOME/gpuctl (~/.cache/gpuctl), made private if missing.
func CacheDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cache dir: %w", err)
	}
	dir = filepath.Join(dir, "gpuctl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("cache dir: %w", err)
	}
	return dir, nil
}

// lastServer remembers, across runs of gpuctl, which server of a highly
// available control plane last answered a request (the leader, once a
// request was sent on to it), so that the next command dials it first
// instead of going round from the first listed: after a failover the first
// listed may be dead. One file per server list, so configs of different
// clusters do not share it. It is only a hint: an address the list no
// longer holds is ignored, and a file that cannot be read or written
// costs a redirect, never a command.
type lastServer struct {
	path  string
	addrs []string
}

// openLastServer is the memory for the server list addrs, nil when there
// is nothing to choose between or no cache dir.
func openLastServer(addrs []string) *lastServer {
	if len(addrs) < 2 {
		return nil
	}
	dir, err := CacheDir()
	if err != nil {
		return nil
	}
	sorted := slices.Clone(addrs)
	slices.Sort(sorted)
	sum := sha256.Sum256([]byte(strings.Join(sorted, ",")))
	return &lastServer{path: filepath.Join(dir, "last-server-"+hex.EncodeToString(sum[:8])), addrs: addrs}
}

// load returns the address remembered, "" for none.
func (l *lastServer) load() string {
	b, err := os.ReadFile(l.path)
	if err != nil {
		return ""
	}
	addr := strings.TrimSpace(string(b))
	if !slices.Contains(l.addrs, addr) {
		return ""
	}
	return addr
}

// save remembers addr. The file is replaced whole, so a command reading
// it meanwhile sees the old address or the new one.
func (l *lastServer) save(addr string) {
	tmp, err := os.CreateTemp(filepath.Dir(l.path), filepath.Base(l.path)+".*")
	if err != nil {
		return
	}
	_, werr := tmp.WriteString(addr + "\n")
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), l.path) != nil {
		os.Remove(tmp.Name())
	}
}
