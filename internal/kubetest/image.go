package kubetest

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/gpuctl/gpuctl/internal/testbin"
)

// Image builds an OCI archive of an image named ref, from scratch, holding
// files (path in the image → path here, each copied with its mode) and
// running entrypoint, and returns the archive's path (in dir). buildah
// builds it in storage of its own, so nothing outlives the test.
func Image(t testing.TB, dir, ref string, files map[string]string, entrypoint []string) string {
	t.Helper()
	store := filepath.Join(dir, "buildah-"+strings.NewReplacer("/", "_", ":", "_").Replace(ref))
	buildah := func(args ...string) string {
		t.Helper()
		all := append([]string{"--root", filepath.Join(store, "root"), "--runroot", filepath.Join(store, "run"), "--storage-driver", "vfs"}, args...)
		out, err := exec.Command("buildah", all...).Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("buildah %s: %v: %s", strings.Join(args, " "), err, stderr)
		}
		return strings.TrimSpace(string(out))
	}
	defer func() {
		buildah("rm", "--all")
		exec.Command("chmod", "-R", "u+w", store).Run()
		os.RemoveAll(store)
	}()
	ctr := buildah("from", "scratch")
	dests := make([]string, 0, len(files))
	for d := range files {
		dests = append(dests, d)
	}
	sort.Strings(dests)
	for _, d := range dests {
		buildah("copy", ctr, files[d], d)
	}
	ep, err := json.Marshal(entrypoint)
	if err != nil {
		t.Fatal(err)
	}
	buildah("config", "--entrypoint", string(ep), ctr)
	buildah("commit", "--quiet", ctr, ref)
	archive := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	buildah("push", "--quiet", ref, fmt.Sprintf("oci-archive:%s:%s", archive, ref))
	return archive
}

// PauseArchive builds the pause image (PauseImage) into dir.
func PauseArchive(t testing.TB, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s", "-o", bin, "./internal/kubetest/pause")
	cmd.Dir = testbin.Root(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the pause program: %v\n%s", err, out)
	}
	return Image(t, dir, PauseImage, map[string]string{"/pause": bin}, []string{"/pause"})
}

// RanksImage is the image RanksArchive builds.
const RanksImage = "localhost/gpuctl/ranks:1"

// RanksArchive builds RanksImage into dir: nodemon (the pods' kube-task)
// as /usr/bin/nodemon, ringtrain as /opt/ringtrain with the libnccl.so.2
// beside it as /opt/libnccl.so.2, and the C library both load.
func RanksArchive(t testing.TB, dir, nodemon, ringtrain string) string {
	t.Helper()
	files := map[string]string{
		"/usr/bin/nodemon":  nodemon,
		"/opt/ringtrain":    ringtrain,
		"/opt/libnccl.so.2": filepath.Join(filepath.Dir(ringtrain), "libnccl.so.2"),
	}
	for _, lib := range []string{"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6"} {
		real, err := filepath.EvalSymlinks(lib)
		if err != nil {
			t.Skipf("this host's C library is not where the image expects it: %v", err)
		}
		files[lib] = real
	}
	return Image(t, dir, RanksImage, files, []string{"/usr/bin/nodemon"})
}

// Libraries maps the shared libraries program loads, as ldd lists them
// (the dynamic loader too), to their files on this host: what an image
// from scratch needs beside a program built with cgo.
func Libraries(t testing.TB, program string) map[string]string {
	t.Helper()
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", program, err)
	}
	libs := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		path := ""
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			path = f[2]
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			path = f[0]
		}
		if path == "" {
			continue // linux-vdso: the kernel's, not a file
		}
		real, err := filepath.EvalSymlinks(path)
		if err != nil {
			t.Fatalf("%s loads %s: %v", program, path, err)
		}
		libs[path] = real
	}
	return libs
}
