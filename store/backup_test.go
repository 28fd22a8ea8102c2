package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuctl/gpuctl/api"
)

// TestBackupRestoreBringsBackJobs backs up a store with jobs, loses the
// state file to damage, is refused with the backup's name, and restores it:
// every job is back, and the damaged file is kept aside.
func TestBackupRestoreBringsBackJobs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	fillStore(t, path, 40)
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	backup, err := s.Backup(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// A job stored after the backup is what a restore loses.
	if err := s.PutJob(&api.Job{Id: "j-ffffff", Name: "late"}); err != nil {
		t.Fatal(err)
	}
	// A restore under a running server is refused.
	_, err = Restore(backup, path, time.Now())
	wantErr(t, err, "in use by a running gpuctl serve")
	s.Close()

	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	_, err = OpenBolt(path)
	wantErr(t, err, backup)

	aside, err := Restore(backup, path, time.Now())
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if fi, err := os.Stat(aside); err != nil || fi.Size() != 0 {
		t.Errorf("the replaced state file was not kept aside at %s: %v", aside, err)
	}
	s, err = OpenBolt(path)
	if err != nil {
		t.Fatalf("open the restored store: %v", err)
	}
	defer s.Close()
	jobs, err := s.Jobs()
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 40 {
		t.Fatalf("restored store holds %d jobs, want the 40 backed up", len(jobs))
	}
	if nodes, _ := s.Nodes(); len(nodes) != 4 {
		t.Errorf("restored store holds %d nodes, want 4", len(nodes))
	}
}

func TestRestoreRefusesDamagedBackup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	fillStore(t, path, 5)
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	backup, err := s.Backup(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	b, _ := os.ReadFile(backup)
	bad := filepath.Join(dir, "bad.db")
	os.WriteFile(bad, b[:len(b)/2], 0o600)
	before, _ := os.ReadFile(path)
	_, err = Restore(bad, path, time.Now())
	wantErr(t, err, "the backup is damaged: it is truncated")
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("a refused restore changed the state file")
	}
	_, err = Restore(filepath.Join(dir, "nope.db"), path, time.Now())
	wantErr(t, err, "no such file")
}

// TestRunBackups backs up on a short period, keeps the newest few, and
// takes one last backup when it is stopped.
func TestRunBackups(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	fillStore(t, path, 3)
	s, err := OpenBolt(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		s.RunBackups(ctx, 20*time.Millisecond, 3, nil)
		close(done)
	}()
	dir := BackupDir(path)
	deadline := time.Now().Add(10 * time.Second)
	for {
		all, _ := Backups(dir)
		if len(all) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("backups after 10s: %v", all)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.PutJob(&api.Job{Id: "j-000999", Name: "last"}); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	cancel()
	<-done
	all, _ := Backups(dir)
	if len(all) > 3 {
		t.Fatalf("%d backups kept, want 3: %v", len(all), all)
	}
	last, at, err := LastBackup(dir)
	if err != nil || at.Before(stopped.Add(-time.Millisecond)) {
		t.Fatalf("last backup %s at %s, want one taken at shutdown (%s): %v", last, at, stopped, err)
	}
	// The shutdown backup holds the last write.
	restored := filepath.Join(t.TempDir(), "state.db")
	if _, err := Restore(last, restored, time.Now()); err != nil {
		t.Fatal(err)
	}
	r, err := OpenBolt(restored)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := r.Job("j-000999"); err != nil {
		t.Fatalf("the shutdown backup lacks the last job: %v", err)
	}
}

func wantErr(t *testing.T, err error, want string) {
	t.Helper()
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want one containing %q", err, want)
	}
	t.Logf("error as reported: %v", err)
}
