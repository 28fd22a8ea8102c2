package ha

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gpuctl/gpuctl/transport"
)

// SecretStore keeps the cluster's shared secrets: get one, or create it
// when no server has yet (two servers racing get the same bytes).
type SecretStore interface {
	LoadOrCreateSecret(name string, create func() ([]byte, error)) ([]byte, error)
}

// sharedFiles are what every server must hold alike to admit the same
// nodes and clients: the cluster CA and the join-token secret. Each
// server's own certificate stays its own, issued by that CA.
var sharedFiles = []string{transport.CACertFile, transport.CAKeyFile, transport.TokenSecretFile}

// OpenSharedAuthority opens the authority in dir with the cluster CA and
// join secret held in st: the first server to start puts its own (new or
// already in dir) there; the others take them. A dir whose CA differs
// from the cluster's is refused rather than silently replaced.
func OpenSharedAuthority(st SecretStore, dir string, opts transport.AuthorityOptions) (*transport.Authority, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ha: create %s: %w", dir, err)
	}
	for attempt := 0; ; attempt++ {
		auth, err := transport.OpenAuthority(dir, opts)
		if err != nil {
			return nil, err
		}
		adopted, err := shareFiles(st, dir)
		if err != nil {
			return nil, err
		}
		if !adopted {
			return auth, nil
		}
		if attempt > 0 {
			return nil, errors.New("ha: the cluster CA in the store keeps changing: is another cluster sharing this etcd prefix?")
		}
		// Another server put its CA first: ours was new and unused, so it
		// is replaced, and the server certificate it signed reissued.
		for _, f := range []string{transport.ServerCertFile, transport.ServerKeyFile} {
			if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, fmt.Errorf("ha: remove %s: %w", f, err)
			}
		}
	}
}

// shareFiles puts dir's shared files in the store where it has none, and
// reports whether it wrote the store's over freshly made local ones.
func shareFiles(st SecretStore, dir string) (adopted bool, err error) {
	fresh, err := freshAuthority(dir)
	if err != nil {
		return false, err
	}
	for _, name := range sharedFiles {
		path := filepath.Join(dir, name)
		local, err := os.ReadFile(path)
		if err != nil {
			return false, fmt.Errorf("ha: read %s: %w", path, err)
		}
		shared, err := st.LoadOrCreateSecret("pki/"+name, func() ([]byte, error) { return local, nil })
		if err != nil {
			return false, fmt.Errorf("ha: share %s through the store: %w", name, err)
		}
		if bytes.Equal(shared, local) {
			continue
		}
		if !fresh {
			return false, fmt.Errorf("ha: %s differs from the cluster's in the store: this data dir belongs to another cluster; move %s aside to take the cluster's", path, dir)
		}
		if err := os.WriteFile(path, shared, 0o600); err != nil {
			return false, fmt.Errorf("ha: write %s: %w", path, err)
		}
		adopted = true
	}
	return adopted, nil
}

// freshAuthority tells whether dir's CA may still be replaced by the
// cluster's: this server has issued nothing from it (no admin.yaml in the
// data dir above it), so no node or client can hold a certificate of it.
func freshAuthority(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(filepath.Dir(dir), "admin.yaml"))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("ha: %w", err)
	}
	return false, nil
}
