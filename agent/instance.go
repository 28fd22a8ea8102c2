package agent

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// instanceFile, under the data dir, holds the id nodemon presents at
// every registration. The server lets a new session of the same node
// supersede the old one at once when the ids match (a restart of this
// host: the old process is gone), and keeps refusing a second live host
// that presents another id under the same name.
const instanceFile = "instance-id"

// instanceID returns the id kept in dir, generating and persisting it the
// first time. It is written as the shim writes its status
// (writeFileAtomic: synced, then renamed), so a crash never leaves half an
// id that a restart would present differently.
func instanceID(dir string) (string, error) {
	path := filepath.Join(dir, instanceFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		id := strings.TrimSpace(string(b))
		if !validInstanceID(id) {
			return "", fmt.Errorf("%s holds %q, not an instance id (32 hex digits): remove the file and nodemon makes a new one", path, id)
		}
		return id, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("read instance id: %w", err)
	}
	raw := make([]byte, 16)
	if _, err := rand.Read(raw); err != nil {
		return "", fmt.Errorf("generate instance id: %w", err)
	}
	id := hex.EncodeToString(raw)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	if err := writeFileAtomic(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("instance id: %w", err)
	}
	return id, nil
}

func validInstanceID(id string) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}
