package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/gpuctl/gpuctl/api"
)

// CorruptError is a state file the store refuses to open: it is empty,
// truncated or damaged, and opening it anyway would either crash the
// server (bbolt maps the file and reads it in place) or start an empty
// cluster in its place. Nothing is changed on disk.
type CorruptError struct {
	Path   string
	Reason string
	// LastBackup is the newest backup next to the file ("" when none) and
	// BackupTime when it was taken.
	LastBackup string
	BackupTime time.Time
}

// Error names the file, what is wrong, and the way out.
func (e *CorruptError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "state file %s is damaged: %s. It was left as it is", e.Path, e.Reason)
	if e.LastBackup != "" {
		fmt.Fprintf(&b, "; the last backup is %s (taken %s): restore it with `gpuctl serve --restore %s` and the same --data-dir, or move %s aside to start an empty cluster",
			e.LastBackup, e.BackupTime.UTC().Format(time.RFC3339), e.LastBackup, e.Path)
	} else {
		fmt.Fprintf(&b, "; there is no backup in %s: restore a copy from elsewhere with `gpuctl serve --restore FILE`, or move %s aside to start an empty cluster (its jobs and nodes are lost)",
			BackupDir(e.Path), e.Path)
	}
	return b.String()
}

// corrupt builds the refusal for path, naming its last backup.
func corrupt(path, format string, args ...any) *CorruptError {
	e := &CorruptError{Path: path, Reason: fmt.Sprintf(format, args...)}
	if last, at, err := LastBackup(BackupDir(path)); err == nil {
		e.LastBackup, e.BackupTime = last, at
	}
	return e
}

// The bbolt file format (version 2), as go.etcd.io/bbolt lays it out:
// every page starts with a 16-byte header (id u64, flags u16, count u16,
// overflow u32); pages 0 and 1 hold a meta record each, at offset 16:
// magic u32, version u32, page size u32, flags u32, root bucket (root page
// u64, sequence u64), freelist page u64, high-water page id u64, txid u64
// and an FNV-1a 64 checksum of the 56 bytes before it.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16
	elementSize    = 16 // branch and leaf elements alike
	metaSize       = 64

	flagBranch   = 0x01
	flagLeaf     = 0x02
	flagMeta     = 0x04
	flagFreelist = 0x10
	flagBucket   = 0x01 // a leaf element that is a nested bucket

	noFreelist = ^uint64(0)
	// maxTreeDepth bounds the walk; a real tree of a few million keys is
	// under ten levels deep.
	maxTreeDepth = 64
)

type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	hwm      uint64 // pages below this id are in use or free
	txid     uint64
}

// parseMeta reads the meta record of a page starting at b.
func parseMeta(b []byte) (boltMeta, error) {
	if len(b) < pageHeaderSize+metaSize {
		return boltMeta{}, errors.New("short meta page")
	}
	le := binary.LittleEndian
	if flags := le.Uint16(b[8:]); flags&flagMeta == 0 {
		return boltMeta{}, fmt.Errorf("not a meta page (flags %#x)", flags)
	}
	m := b[pageHeaderSize:]
	if magic := le.Uint32(m[0:]); magic != boltMagic {
		return boltMeta{}, fmt.Errorf("no bbolt magic (%#x)", magic)
	}
	if v := le.Uint32(m[4:]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("bbolt format version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(m[:56])
	if sum := le.Uint64(m[56:]); sum != h.Sum64() {
		return boltMeta{}, errors.New("meta checksum does not match")
	}
	meta := boltMeta{
		pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
		hwm: le.Uint64(m[40:]), txid: le.Uint64(m[48:]),
	}
	if ps := meta.pageSize; ps < 1024 || ps > 1<<24 || ps&(ps-1) != 0 {
		return boltMeta{}, fmt.Errorf("page size %d is not a power of two from 1 KiB to 16 MiB", ps)
	}
	return meta, nil
}

// checkFile reads the state file at path with plain reads, never through
// a memory map, and refuses it with a *CorruptError when bbolt could not
// use it safely: empty, shorter than its meta page says (reading a mapped
// page past the end of a file is a SIGBUS), without a valid meta page, or
// with a page tree that points outside the file, at the wrong kind of
// page, or at one page twice. A missing file is fine, unless backups exist
// (then the file was lost, not never made).
func checkFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		if last, _, err := LastBackup(BackupDir(path)); err == nil && last != "" {
			return corrupt(path, "it is missing although backups of it exist")
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("open store %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("open store %s: %w", path, err)
	}
	size := fi.Size()
	if size == 0 {
		return corrupt(path, "it is empty (0 bytes)")
	}
	meta, err := readMeta(f, size)
	if err != nil {
		return corrupt(path, "%v", err)
	}
	ps := int64(meta.pageSize)
	if need := int64(meta.hwm) * ps; meta.hwm < 2 || size < need {
		return corrupt(path, "it is truncated: %d bytes, but its meta page (txid %d) says it holds %d pages of %d bytes (%d bytes)",
			size, meta.txid, meta.hwm, ps, need)
	}
	w := &pageWalker{r: f, pageSize: ps, hwm: meta.hwm, seen: map[uint64]uint64{}}
	if meta.freelist != noFreelist {
		if err := w.freelist(meta.freelist); err != nil {
			return corrupt(path, "freelist: %v", err)
		}
	}
	// The root is referenced from the meta page in use: txid%2 is its id.
	if err := w.tree(meta.root, meta.txid%2, 0); err != nil {
		return corrupt(path, "%v", err)
	}
	return nil
}

// readMeta returns the meta record bbolt would use: the valid one of the
// two with the higher transaction id.
func readMeta(r io.ReaderAt, size int64) (boltMeta, error) {
	first := make([]byte, min(size, 4096))
	if _, err := r.ReadAt(first, 0); err != nil && !errors.Is(err, io.EOF) {
		return boltMeta{}, err
	}
	m0, err0 := parseMeta(first)
	ps := int64(m0.pageSize)
	if err0 != nil {
		// The first meta page is bad: find the second by trying the page
		// sizes bbolt may have used.
		for ps = 1024; ps <= 1<<24 && ps+pageHeaderSize+metaSize <= size; ps <<= 1 {
			b := make([]byte, pageHeaderSize+metaSize)
			if _, err := r.ReadAt(b, ps); err == nil {
				if m, err := parseMeta(b); err == nil && int64(m.pageSize) == ps {
					return m, nil
				}
			}
		}
		if size < 2*4096 {
			return boltMeta{}, fmt.Errorf("it is truncated to %d bytes, less than its two meta pages", size)
		}
		return boltMeta{}, fmt.Errorf("neither meta page is valid (page 0: %v): the file is zeroed, overwritten or not a gpuctl store", err0)
	}
	if size < 2*ps {
		return boltMeta{}, fmt.Errorf("it is truncated to %d bytes, less than its two meta pages of %d bytes", size, ps)
	}
	b := make([]byte, pageHeaderSize+metaSize)
	if _, err := r.ReadAt(b, ps); err != nil {
		return m0, nil
	}
	if m1, err := parseMeta(b); err == nil && m1.txid > m0.txid {
		return m1, nil
	}
	return m0, nil
}

// pageWalker follows a bbolt page tree with plain reads, checking that
// every page it reaches lies inside the file and is what its parent says.
type pageWalker struct {
	r        io.ReaderAt
	pageSize int64
	hwm      uint64
	// seen maps each page reached to the page that referenced it.
	seen map[uint64]uint64
}

// page reads page id and its overflow pages, checking the header.
func (w *pageWalker) page(id, parent uint64) ([]byte, error) {
	if id < 2 || id >= w.hwm {
		return nil, fmt.Errorf("page %d (referenced from page %d) is outside the file's %d pages", id, parent, w.hwm)
	}
	head := make([]byte, pageHeaderSize)
	if _, err := w.r.ReadAt(head, int64(id)*w.pageSize); err != nil {
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(head); got != id {
		return nil, fmt.Errorf("page %d (referenced from page %d) carries id %d: it was overwritten", id, parent, got)
	}
	overflow := uint64(le.Uint32(head[12:]))
	if id+overflow >= w.hwm {
		return nil, fmt.Errorf("page %d runs %d pages past the end of the file", id, id+overflow+1-w.hwm)
	}
	for p := id; p <= id+overflow; p++ {
		if by, ok := w.seen[p]; ok {
			return nil, fmt.Errorf("page %d is referenced from page %d and from page %d", p, by, parent)
		}
		w.seen[p] = parent
	}
	b := make([]byte, int64(overflow+1)*w.pageSize)
	if _, err := w.r.ReadAt(b, int64(id)*w.pageSize); err != nil {
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	return b, nil
}

func (w *pageWalker) freelist(id uint64) error {
	b, err := w.page(id, 0)
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	if flags := le.Uint16(b[8:]); flags != flagFreelist {
		return fmt.Errorf("page %d should be the freelist but has flags %#x", id, flags)
	}
	start, count := pageHeaderSize, uint64(le.Uint16(b[10:]))
	if count == 0xFFFF {
		count, start = le.Uint64(b[pageHeaderSize:]), pageHeaderSize+8
	}
	if count > uint64(len(b)-start)/8 {
		return fmt.Errorf("page %d lists %d free pages, more than it can hold", id, count)
	}
	for i := range count {
		if free := le.Uint64(b[start+int(i)*8:]); free < 2 || free >= w.hwm {
			return fmt.Errorf("page %d lists free page %d, outside the file's %d pages", id, free, w.hwm)
		}
	}
	return nil
}

// tree walks the bucket tree rooted at page id.
func (w *pageWalker) tree(id, parent uint64, depth int) error {
	if depth > maxTreeDepth {
		return fmt.Errorf("page %d: tree deeper than %d levels (a loop)", id, maxTreeDepth)
	}
	b, err := w.page(id, parent)
	if err != nil {
		return err
	}
	return w.node(b, id, depth, false)
}

// node checks one branch or leaf page held in b (a page of the file, or,
// inlined, an inline bucket's page inside a value) and walks what it
// references.
func (w *pageWalker) node(b []byte, id uint64, depth int, inlined bool) error {
	le := binary.LittleEndian
	flags, count := le.Uint16(b[8:]), int(le.Uint16(b[10:]))
	if pageHeaderSize+count*elementSize > len(b) {
		return fmt.Errorf("page %d claims %d elements, more than it can hold", id, count)
	}
	for i := range count {
		e := pageHeaderSize + i*elementSize
		switch flags {
		case flagBranch:
			pos, ksize, child := int(le.Uint32(b[e:])), int(le.Uint32(b[e+4:])), le.Uint64(b[e+8:])
			if e+pos+ksize > len(b) || pos < 0 {
				return fmt.Errorf("page %d: key %d lies outside the page", id, i)
			}
			if err := w.tree(child, id, depth+1); err != nil {
				return err
			}
		case flagLeaf:
			eflags, pos, ksize, vsize := le.Uint32(b[e:]), int(le.Uint32(b[e+4:])), int(le.Uint32(b[e+8:])), int(le.Uint32(b[e+12:]))
			end := e + pos + ksize + vsize
			if pos < 0 || ksize < 0 || vsize < 0 || end > len(b) || end < e {
				return fmt.Errorf("page %d: entry %d lies outside the page", id, i)
			}
			if eflags&flagBucket == 0 {
				continue
			}
			v := b[e+pos+ksize : end]
			if len(v) < 16 {
				return fmt.Errorf("page %d: bucket %q has a %d-byte header, want 16", id, b[e+pos:e+pos+ksize], len(v))
			}
			if root := le.Uint64(v); root != 0 {
				if err := w.tree(root, id, depth+1); err != nil {
					return err
				}
				continue
			}
			// An inline bucket: its one leaf page follows the header. bbolt
			// inlines only buckets without buckets of their own, so one
			// inside is damage (and, with overlapping entries, a walk that
			// would never end).
			inline := v[16:]
			if len(inline) < pageHeaderSize || le.Uint16(inline[8:]) != flagLeaf {
				return fmt.Errorf("page %d: inline bucket %q is not a leaf page", id, b[e+pos:e+pos+ksize])
			}
			if inlined {
				return fmt.Errorf("page %d: an inline bucket holds a bucket", id)
			}
			if err := w.node(inline, id, depth+1, true); err != nil {
				return err
			}
		default:
			return fmt.Errorf("page %d should be a branch or leaf page but has flags %#x: it was overwritten", id, flags)
		}
	}
	if flags != flagBranch && flags != flagLeaf {
		return fmt.Errorf("page %d should be a branch or leaf page but has flags %#x: it was overwritten", id, flags)
	}
	return nil
}

// protect runs f on a goroutine of its own where a fault reading mapped
// memory (SIGBUS, SIGSEGV) is a panic, and turns any panic into an error:
// the checks above make one unlikely, this makes it harmless.
func protect(f func() error) error {
	done := make(chan error, 1)
	go func() {
		debug.SetPanicOnFault(true)
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Errorf("reading it failed: %v", r)
			}
		}()
		done <- f()
	}()
	return <-done
}

// openChecked opens the bbolt file at path only once checkFile found it
// sound, then runs bbolt's own consistency check and decodes every record
// of the buckets it knows. Any failure is a *CorruptError.
func openChecked(path string, opts *bolt.Options) (*bolt.DB, error) {
	if err := checkFile(path); err != nil {
		return nil, err
	}
	var db *bolt.DB
	err := protect(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, opts)
		return err
	})
	if err != nil {
		var pathErr *fs.PathError
		if errors.Is(err, bolt.ErrTimeout) || errors.As(err, &pathErr) {
			return nil, err
		}
		return nil, corrupt(path, "bbolt cannot open it: %v", err)
	}
	if err := verifyDB(db); err != nil {
		db.Close()
		return nil, corrupt(path, "%v", err)
	}
	return db, nil
}

// records maps the buckets whose values are protobuf records to their type.
var records = map[string]func() proto.Message{
	string(bucketNodes):      func() proto.Message { return &api.NodeStatus{} },
	string(bucketEvents):     func() proto.Message { return &api.Event{} },
	string(bucketJobs):       func() proto.Message { return &api.Job{} },
	string(bucketIdentities): func() proto.Message { return &api.Identity{} },
	string(bucketRevoked):    func() proto.Message { return &api.Revocation{} },
	string(bucketTokens):     func() proto.Message { return &api.JoinToken{} },
}

// verifyDB runs bbolt's consistency check (tx.Check) and decodes every
// record, so damage inside a value (which bbolt does not checksum) is
// found at start rather than when a client asks for that record.
func verifyDB(db *bolt.DB) error {
	return protect(func() error {
		return db.View(func(tx *bolt.Tx) error {
			var problems []string
			for err := range tx.Check() {
				if len(problems) < 5 {
					problems = append(problems, err.Error())
				}
			}
			if len(problems) > 0 {
				return fmt.Errorf("bbolt consistency check: %s", strings.Join(problems, "; "))
			}
			return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
				mk := records[string(name)]
				return b.ForEach(func(k, v []byte) error {
					if mk == nil || v == nil {
						return nil
					}
					if err := proto.Unmarshal(v, mk()); err != nil {
						return fmt.Errorf("bucket %s: record %x does not decode: %v", name, k, err)
					}
					return nil
				})
			})
		})
	})
}
