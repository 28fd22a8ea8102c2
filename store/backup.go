package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Backup defaults for gpuctl serve.
const (
	DefaultBackupEvery = 10 * time.Minute
	DefaultBackupKeep  = 6
)

const (
	backupPrefix = "state-"
	backupSuffix = ".db"
	// backupStamp sorts as text in time order.
	backupStamp = "20060102T150405.000Z"
)

// BackupDir is where the backups of the state file at statePath live: a
// backups folder next to it.
func BackupDir(statePath string) string {
	return filepath.Join(filepath.Dir(statePath), "backups")
}

// Backup writes a consistent copy of the store, taken inside one read
// transaction (bbolt's tx.WriteTo, so writers go on meanwhile), into
// BackupDir as state-<time>.db, checks the copy, and returns its path.
func (s *Bolt) Backup(now time.Time) (string, error) {
	dir := BackupDir(s.db.Path())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("back up store: %w", err)
	}
	path := filepath.Join(dir, backupPrefix+now.UTC().Format(backupStamp)+backupSuffix)
	tmp, err := os.CreateTemp(dir, ".backup-*")
	if err != nil {
		return "", fmt.Errorf("back up store: %w", err)
	}
	defer os.Remove(tmp.Name())
	err = s.db.View(func(tx *bolt.Tx) error {
		_, err := tx.WriteTo(tmp)
		return err
	})
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("back up store to %s: %w", path, err)
	}
	// A copy that would be refused at restore is no backup.
	if err := checkFile(tmp.Name()); err != nil {
		return "", fmt.Errorf("back up store to %s: the copy does not check: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o600); err != nil {
		return "", fmt.Errorf("back up store: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("back up store to %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return "", fmt.Errorf("back up store: %w", err)
	}
	return path, nil
}

// Backups lists the backups in dir, oldest first.
func Backups(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list backups: %w", err)
	}
	var out []string
	for _, e := range entries {
		if _, ok := backupTime(e.Name()); ok && e.Type().IsRegular() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

// LastBackup returns the newest backup in dir and when it was taken, or ""
// when there is none.
func LastBackup(dir string) (string, time.Time, error) {
	all, err := Backups(dir)
	if err != nil || len(all) == 0 {
		return "", time.Time{}, err
	}
	last := all[len(all)-1]
	at, _ := backupTime(filepath.Base(last))
	return last, at, nil
}

func backupTime(name string) (time.Time, bool) {
	stamp, ok := strings.CutPrefix(name, backupPrefix)
	if !ok {
		return time.Time{}, false
	}
	if stamp, ok = strings.CutSuffix(stamp, backupSuffix); !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(backupStamp, stamp)
	return t, err == nil
}

// PruneBackups removes all but the newest keep backups in dir.
func PruneBackups(dir string, keep int) error {
	all, err := Backups(dir)
	if err != nil {
		return err
	}
	var errs []error
	for len(all) > max(keep, 1) {
		if err := os.Remove(all[0]); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
		all = all[1:]
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("prune backups in %s: %w", dir, err)
	}
	return nil
}

// RunBackups backs the store up every every (DefaultBackupEvery when 0)
// and once more when ctx ends, keeping the newest keep (DefaultBackupKeep
// when 0). It returns after that last backup, so call Close after it. A
// backup that fails is logged and tried again at the next tick.
func (s *Bolt) RunBackups(ctx context.Context, every time.Duration, keep int, log *slog.Logger) {
	if every <= 0 {
		every = DefaultBackupEvery
	}
	if keep <= 0 {
		keep = DefaultBackupKeep
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	backup := func(why string) {
		start := time.Now()
		path, err := s.Backup(start)
		if err != nil {
			log.Error("store backup failed", "why", why, "err", err)
			return
		}
		log.Info("store backed up", "why", why, "path", path, "took", time.Since(start).Round(time.Millisecond))
		if err := PruneBackups(BackupDir(s.db.Path()), keep); err != nil {
			log.Warn("prune backups", "err", err)
		}
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			backup("shutdown")
			return
		case <-t.C:
			backup("periodic")
		}
	}
}

// Restore puts the backup at from in place of the state file at
// statePath. It refuses a backup that does not check (as a damaged state
// file is refused at open) and a state file a running server holds; the
// state file it replaces is kept next to it as
// <name>.before-restore-<time>, whose path it returns ("" when there was
// none).
func Restore(from, statePath string, now time.Time) (string, error) {
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("restore %s from %s: %w", statePath, from, err)
	}
	if _, err := os.Stat(from); err != nil {
		return fail(err)
	}
	if err := checkBackup(from); err != nil {
		return fail(err)
	}
	dir := filepath.Dir(statePath)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	unlock, err := lockFree(statePath)
	if err != nil {
		return fail(err)
	}
	defer unlock()
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(statePath)+".restore-*")
	if err != nil {
		return fail(err)
	}
	defer os.Remove(tmp.Name())
	src, err := os.Open(from)
	if err != nil {
		tmp.Close()
		return fail(err)
	}
	_, err = tmp.ReadFrom(src)
	src.Close()
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o600)
	}
	if err != nil {
		return fail(err)
	}
	aside := ""
	if _, err := os.Stat(statePath); err == nil {
		aside = statePath + ".before-restore-" + now.UTC().Format(backupStamp)
		if err := os.Rename(statePath, aside); err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(tmp.Name(), statePath); err != nil {
		return fail(err)
	}
	if err := syncDir(dir); err != nil {
		return fail(err)
	}
	return aside, nil
}

// checkBackup checks a backup as OpenBolt checks a state file, read-only.
func checkBackup(path string) error {
	if err := checkFile(path); err != nil {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return fmt.Errorf("the backup is damaged: %s; pick another (the backups are in %s)", ce.Reason, filepath.Dir(path))
		}
		return err
	}
	var db *bolt.DB
	err := protect(func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		return err
	})
	if err != nil {
		return fmt.Errorf("the backup cannot be opened: %w", err)
	}
	defer db.Close()
	if err := verifyDB(db); err != nil {
		return fmt.Errorf("the backup is damaged: %w; pick another (the backups are in %s)", err, filepath.Dir(path))
	}
	return nil
}

// lockFree takes the lock a running server holds on the state file (bbolt
// flocks it), so a restore never swaps the file under a live server.
func lockFree(statePath string) (func(), error) {
	f, err := os.OpenFile(statePath, os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s is in use by a running gpuctl serve: stop it first", statePath)
		}
		return nil, fmt.Errorf("lock %s: %w", statePath, err)
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
