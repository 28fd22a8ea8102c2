package store

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/gpuctl/gpuctl/api"
)

// fillStore writes a store worth keeping: nodes, events, and enough jobs
// for a tree of several levels.
func fillStore(t testing.TB, path string, jobs int) {
	t.Helper()
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 4 {
		if err := s.PutNode(node(fmt.Sprintf("node-%02d", i), api.NodeState_NODE_STATE_READY)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range jobs {
		j := &api.Job{Id: fmt.Sprintf("j-%06x", i), Name: fmt.Sprintf("job-%d", i), State: api.JobState_JOB_STATE_RUNNING,
			SpecYaml: strings.Repeat("command: [ringtrain, --steps, 1000]\n", 8)}
		if err := s.PutJob(j); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		if err := s.AppendEvent(&api.Event{Node: "node-00", TimeUnixNano: int64(i), Message: "x"}); err != nil {
			t.Fatal(err)
		}
	}
}

// pagesOfType lists the pages of a closed store that bbolt says are of the
// given type (branch, leaf).
func pagesOfType(t *testing.T, path string, types ...string) []int {
	t.Helper()
	// Not read-only: bbolt loads the freelist, which tells free pages apart.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var ids []int
	db.View(func(tx *bolt.Tx) error {
		for id := 2; ; id++ {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				return nil
			}
			for _, typ := range types {
				if info.Type == typ {
					ids = append(ids, id)
				}
			}
		}
	})
	if len(ids) == 0 {
		t.Fatalf("no %v pages in %s", types, path)
	}
	return ids
}

func fileHash(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// TestOpenRefusesDamagedState damages a real state file in each of the ways
// a disk, a crash or a hand can, and opens it: each is a *CorruptError that
// names the file and the last backup, the file is left as it was, and
// nothing panics or faults.
func TestOpenRefusesDamagedState(t *testing.T) {
	master := filepath.Join(t.TempDir(), "state.db")
	fillStore(t, master, 300)
	good, err := os.ReadFile(master)
	if err != nil {
		t.Fatal(err)
	}
	const ps = 4096
	leaves := pagesOfType(t, master, "leaf")
	inner := pagesOfType(t, master, "branch", "leaf")
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.UintN(256))
		}
		return b
	}
	overwrite := func(b []byte, page int, with []byte) {
		copy(b[page*ps:(page+1)*ps], with)
	}

	tests := []struct {
		name   string
		damage func(b []byte) []byte
		want   string
	}{
		{"zero length", func(b []byte) []byte { return nil }, "empty (0 bytes)"},
		{"truncated to half", func(b []byte) []byte { return b[:len(b)/2] }, "truncated"},
		{"truncated inside the meta pages", func(b []byte) []byte { return b[:ps+100] }, "truncated"},
		{"last page cut by one byte", func(b []byte) []byte {
			m, err := readMeta(bytes.NewReader(b), int64(len(b)))
			if err != nil {
				t.Fatal(err)
			}
			return b[:int(m.hwm)*ps-1]
		}, "truncated"},
		{"zeroed", func(b []byte) []byte { return make([]byte, len(b)) }, "neither meta page is valid"},
		{"meta pages zeroed", func(b []byte) []byte { copy(b, make([]byte, 2*ps)); return b }, "neither meta page is valid"},
		{"one leaf page random", func(b []byte) []byte { overwrite(b, leaves[len(leaves)/2], random(ps)); return b }, "page"},
		{"first tree page random", func(b []byte) []byte { overwrite(b, inner[0], random(ps)); return b }, "page"},
		{"every tree page random", func(b []byte) []byte {
			for _, p := range inner {
				overwrite(b, p, random(ps))
			}
			return b
		}, "page"},
		{"leaf page zeroed", func(b []byte) []byte { overwrite(b, leaves[0], make([]byte, ps)); return b }, "page"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, withBackup := range []bool{false, true} {
				dir := t.TempDir()
				path := filepath.Join(dir, "state.db")
				var backup string
				if withBackup {
					if err := os.WriteFile(path, good, 0o600); err != nil {
						t.Fatal(err)
					}
					s, err := OpenBolt(path)
					if err != nil {
						t.Fatal(err)
					}
					if backup, err = s.Backup(time.Now()); err != nil {
						t.Fatal(err)
					}
					s.Close()
				}
				if err := os.WriteFile(path, tc.damage(bytes.Clone(good)), 0o600); err != nil {
					t.Fatal(err)
				}
				before := fileHash(t, path)
				s, err := OpenBolt(path)
				if err == nil {
					s.Close()
					t.Fatalf("a damaged state file opened (backup %v)", withBackup)
				}
				var ce *CorruptError
				if !errors.As(err, &ce) {
					t.Fatalf("error %v is not a *CorruptError", err)
				}
				msg := err.Error()
				for _, want := range []string{path, tc.want} {
					if !strings.Contains(msg, want) {
						t.Errorf("refusal lacks %q: %s", want, msg)
					}
				}
				if withBackup && (ce.LastBackup != backup || !strings.Contains(msg, "--restore "+backup)) {
					t.Errorf("refusal does not name the last backup %s: %s", backup, msg)
				}
				if !withBackup && !strings.Contains(msg, "no backup in "+filepath.Join(dir, "backups")) {
					t.Errorf("refusal does not say there is no backup: %s", msg)
				}
				if fileHash(t, path) != before {
					t.Errorf("the refused file was changed")
				}
				if withBackup {
					t.Logf("%s", msg)
				}
			}
		})
	}
}

func TestOpenRefusesUndecodableRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	fillStore(t, path, 3)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Bytes bbolt stores happily but no Job decodes from: a value damaged
	// in place, which bbolt's pages carry no checksum for.
	db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketJobs).Put([]byte("j-000001"), []byte{0xff, 0xff, 0xff})
	})
	db.Close()
	_, err = OpenBolt(path)
	var ce *CorruptError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "bucket jobs: record 6a2d303030303031 does not decode") {
		t.Fatalf("OpenBolt = %v, want the damaged job named", err)
	}
}

func TestMissingStateWithBackupsIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	fillStore(t, path, 2)
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	backup, err := s.Backup(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	os.Remove(path)
	_, err = OpenBolt(path)
	if err == nil || !strings.Contains(err.Error(), "missing although backups of it exist") || !strings.Contains(err.Error(), backup) {
		t.Fatalf("OpenBolt of a lost state file = %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatal("an empty store was created in place of the lost one")
	}
}

// FuzzCheckFile opens arbitrary bytes as a state file: it is refused with a
// *CorruptError or opens, and never panics or faults (a fault would kill the
// fuzzing process, which reports it as a crasher).
func FuzzCheckFile(f *testing.F) {
	// Small seeds keep the fuzzer fast: a store of 1 KiB pages with a few
	// records of each kind, copied at its used size.
	db, err := bolt.Open(filepath.Join(f.TempDir(), "seed.db"), 0o600, &bolt.Options{PageSize: 1024})
	if err != nil {
		f.Fatal(err)
	}
	s := &Bolt{db: db, maxEvents: DefaultMaxEvents}
	for _, b := range [][]byte{bucketNodes, bucketEvents, bucketEventSeqs, bucketMeta} {
		db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(b); return err })
	}
	s.PutNode(node("node-00", api.NodeState_NODE_STATE_READY))
	s.PutJob(&api.Job{Id: "j-000001", Name: "ring", SpecYaml: strings.Repeat("x", 1500)})
	s.AppendNodeEvents("node-00", []*api.Event{{Seq: 1, Node: "node-00"}})
	s.PutToken(&api.JoinToken{Id: "0123456789abcdef", Uses: 1})
	var seed bytes.Buffer
	db.View(func(tx *bolt.Tx) error { _, err := tx.WriteTo(&seed); return err })
	db.Close()
	good := seed.Bytes()
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "state.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := OpenBolt(path)
		if err != nil {
			var ce *CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("refusal %v is not a *CorruptError", err)
			}
			return
		}
		defer s.Close()
		if _, err := s.Jobs(); err != nil {
			t.Fatalf("opened, but its jobs do not list: %v", err)
		}
		if _, err := s.Events(EventFilter{}); err != nil {
			t.Fatalf("opened, but its events do not list: %v", err)
		}
	})
}
