package sshserve

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	gossh "golang.org/x/crypto/ssh"

	"github.com/gpuctl/gpuctl/transport"
)

// Key is one authorized key: who it is and what role it acts with.
type Key struct {
	Name string
	Role transport.Role
	// Fingerprint is the key's SHA-256 fingerprint, as ssh-keygen -l shows.
	Fingerprint string
	// Line is its line in the file.
	Line int
}

// ReadAuthorizedKeys reads and parses the authorized-keys file at path,
// its keys in file order.
func ReadAuthorizedKeys(path string) ([]Key, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("authorized keys: %w", err)
	}
	keys, err := ParseAuthorizedKeys(path, data)
	if err != nil {
		return nil, err
	}
	out := slices.Collect(maps.Values(keys))
	slices.SortFunc(out, func(a, b Key) int { return a.Line - b.Line })
	return out, nil
}

// ParseAuthorizedKeys reads an authorized-keys file: OpenSSH
// authorized_keys lines, each with a role option and optionally a name
// option, e.g.
//
//	role=operator ssh-ed25519 AAAA… alice@laptop
//	role=viewer,name=oncall ecdsa-sha2-nistp256 AAAA…
//
// The name is the name= option, else the key's comment; it must be a valid
// gpuctl identity name (letters, digits, '.', '-', '_', '@'). Blank lines
// and # comments are skipped. Any bad line fails the whole file, naming
// the line, so a typo never silently locks someone out or in.
func ParseAuthorizedKeys(path string, data []byte) (map[string]Key, error) {
	keys := map[string]Key{}
	for i, raw := range bytes.Split(data, []byte("\n")) {
		line := bytes.TrimSpace(raw)
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		where := fmt.Sprintf("%s:%d", path, i+1)
		pub, comment, options, _, err := gossh.ParseAuthorizedKey(line)
		if err != nil {
			return nil, fmt.Errorf("%s: %v: want `role=viewer|operator|admin KEYTYPE BASE64 NAME`", where, err)
		}
		var role transport.Role
		name := strings.TrimSpace(comment)
		for _, o := range options {
			k, v, _ := strings.Cut(o, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "role":
				r, err := transport.ParseRole(v)
				if err != nil {
					return nil, fmt.Errorf("%s: %v", where, err)
				}
				role = r
			case "name":
				name = v
			default:
				return nil, fmt.Errorf("%s: option %q is not understood here: use role= and name=", where, o)
			}
		}
		if role == "" {
			return nil, fmt.Errorf("%s: no role: put role=viewer, role=operator or role=admin before the key type", where)
		}
		if err := transport.ValidateName(name); err != nil {
			return nil, fmt.Errorf("%s: %v: give the key a comment or a name= option", where, err)
		}
		fp := gossh.FingerprintSHA256(pub)
		if prev, dup := keys[fp]; dup {
			return nil, fmt.Errorf("%s: key %s is listed twice (also as %s)", where, fp, prev.Name)
		}
		keys[fp] = Key{Name: name, Role: role, Fingerprint: fp, Line: i + 1}
	}
	return keys, nil
}

// keyFile is the authorized-keys file, read at each login and each second
// (see Server.watch) and parsed again whenever its content changes, so a
// key removed from it is refused from the next login on and its open
// sessions end. The content's hash, not its mtime, says whether it
// changed: an edit within one mtime tick keeps the size.
type keyFile struct {
	path string
	mu   sync.Mutex
	sum  [sha256.Size]byte
	keys map[string]Key
	err  error
}

func (f *keyFile) load() (map[string]Key, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	data, err := os.ReadFile(f.path)
	if err != nil {
		return nil, fmt.Errorf("authorized keys: %w", err)
	}
	sum := sha256.Sum256(data)
	if f.keys != nil && sum == f.sum {
		return f.keys, f.err
	}
	f.keys, f.err = ParseAuthorizedKeys(f.path, data)
	f.sum = sum
	if f.err != nil {
		// A broken file refuses everyone rather than guessing.
		f.keys = map[string]Key{}
	}
	return f.keys, f.err
}

// lookup returns the key's entry, if it is listed now.
func (f *keyFile) lookup(pub gossh.PublicKey) (Key, bool, error) {
	if pub == nil {
		return Key{}, false, nil
	}
	keys, err := f.load()
	if err != nil {
		return Key{}, false, err
	}
	k, ok := keys[gossh.FingerprintSHA256(pub)]
	return k, ok, nil
}
