package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/objstore"
)

// newStore creates a store of 1 MiB with shale in a directory others can
// enter, and returns its path.
func newStore(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shale-objstore")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "store")
	if code, out := run(t, "objstore", "create", path, "--size", "1MiB"); code != 0 {
		t.Fatalf("create: %s", out)
	}
	return path
}

func putFile(t *testing.T, store, key string, data []byte) {
	t.Helper()
	in := filepath.Join(t.TempDir(), "in")
	os.WriteFile(in, data, 0o644)
	if code, out := run(t, "objstore", "put", store, key, in); code != 0 {
		t.Fatalf("put %s: %s", key, out)
	}
}

// TestObjstoreInUse: while a store is open in another process, shale's
// commands fail with one line naming that process; readers share.
func TestObjstoreInUse(t *testing.T) {
	store := newStore(t)
	putFile(t, store, "k", []byte("hello"))
	s, err := objstore.Open(store, objstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("shale: store %s is in use by process %d (%s ", store, os.Getpid(), os.Args[0])
	for _, args := range [][]string{{"put", store, "k", "/dev/null"}, {"get", store, "k"}, {"stat", store}, {"rm", store, "k"}} {
		code, out := run(t, append([]string{"objstore"}, args...)...)
		wantOneLineError(t, code, out, "): stop it, or wait")
		if !strings.HasPrefix(out, want) {
			t.Errorf("%s beside an owner: %q, want %q...", args[0], out, want)
		}
	}
	s.Close()

	r, err := objstore.Open(store, objstore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if code, out := run(t, "objstore", "get", store, "k"); code != 0 || out != "hello" {
		t.Errorf("get beside a reader: %d %q", code, out)
	}
	if code, out := run(t, "objstore", "stat", store); code != 0 {
		t.Errorf("stat beside a reader: %q", out)
	}
	code, out := run(t, "objstore", "rm", store, "k")
	wantOneLineError(t, code, out, "is in use by process")
}

// TestObjstoreCreateFails: a failed create leaves no file, so a retry works.
func TestObjstoreCreateFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n3")
	code, out := run(t, "objstore", "create", path, "--size", "1")
	wantOneLineError(t, code, out, "out of range")
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("failed create left %s behind", path)
	}
	if code, out := run(t, "objstore", "create", path, "--size", "1MiB"); code != 0 {
		t.Fatalf("retry: %s", out)
	}
	if code, out := run(t, "objstore", "stat", path); code != 0 {
		t.Fatalf("stat after retry: %s", out)
	}
	// An existing file is refused and kept.
	code, out = run(t, "objstore", "create", path, "--size", "1")
	wantOneLineError(t, code, out, "already exists")
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("create over an existing store removed it: %v", err)
	}
}

// TestObjstoreReadOnlyStore: get and stat work on a store the user may
// only read, and write nothing to it, even as root.
func TestObjstoreReadOnlyStore(t *testing.T) {
	store := newStore(t)
	data := bytes.Repeat([]byte("data"), 3000)
	putFile(t, store, "k", data)
	os.Chmod(store, 0o444)
	before, _ := os.ReadFile(store)
	st0, _ := os.Stat(store)

	// As nobody, who cannot open the file for writing.
	for _, args := range [][]string{{"get", store, "k"}, {"stat", store}} {
		cmd := exec.Command(shaleBin, append([]string{"objstore"}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		code, out := runCmd(t, cmd)
		if code != 0 {
			t.Fatalf("%s of a 0444 store as nobody: %s", args[0], out)
		}
		if args[0] == "get" && out != string(data) {
			t.Fatalf("get of a 0444 store returned %d bytes, want %d", len(out), len(data))
		}
	}
	// As root, who could.
	out := filepath.Join(t.TempDir(), "out")
	if code, msg := run(t, "objstore", "get", store, "k", out); code != 0 {
		t.Fatalf("get as root: %s", msg)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, data) {
		t.Fatalf("get wrote %d bytes, want %d", len(got), len(data))
	}
	if code, msg := run(t, "objstore", "stat", store); code != 0 || !strings.Contains(msg, "objects        1\n") {
		t.Fatalf("stat as root: %s", msg)
	}
	after, _ := os.ReadFile(store)
	st1, _ := os.Stat(store)
	if !bytes.Equal(before, after) || !st0.ModTime().Equal(st1.ModTime()) {
		t.Fatalf("get or stat wrote to the store")
	}
}

// TestObjstoreLongKey: a key over the limit is reported by its length,
// not printed.
func TestObjstoreLongKey(t *testing.T) {
	store := newStore(t)
	key := strings.Repeat("k", 100000)
	for _, args := range [][]string{{"put", store, key, "/dev/null"}, {"get", store, key}, {"rm", store, key}} {
		code, out := run(t, append([]string{"objstore"}, args...)...)
		wantOneLineError(t, code, out, "100000 bytes long, more than the limit of 488")
		if len(out) > 200 {
			t.Errorf("%s with a 100000-byte key: a %d-byte message", args[0], len(out))
		}
	}
	code, out := run(t, "objstore", "get", store, "")
	wantOneLineError(t, code, out, "the key is empty")
}

// TestObjstoreGetFull: get onto a full file system removes the file it
// made instead of leaving it empty.
func TestObjstoreGetFull(t *testing.T) {
	store := newStore(t)
	data := bytes.Repeat([]byte("0123456789abcdef"), 200<<10/16)
	putFile(t, store, "big", data)
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	out := filepath.Join(mnt, "out")
	code, msg := run(t, "objstore", "get", store, "big", out)
	wantOneLineError(t, code, msg, "no space left on device")
	if _, err := os.Stat(out); err == nil {
		t.Fatalf("failed get left %s behind", out)
	}
	// The object still fits elsewhere.
	out = filepath.Join(t.TempDir(), "out")
	if code, msg := run(t, "objstore", "get", store, "big", out); code != 0 {
		t.Fatalf("get: %s", msg)
	}
}

// TestObjstoreMessages: an empty file is no store, not a corrupt one, and
// a missing key's error does not send the user to a listing of keys that
// stat does not give.
func TestObjstoreMessages(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, nil, 0o644)
	code, out := run(t, "objstore", "stat", empty)
	wantOneLineError(t, code, out, "is an empty file, not a store: make one with 'shale objstore create "+empty+" --size SIZE'")
	store := newStore(t)
	code, out = run(t, "objstore", "get", store, "nokey")
	wantOneLineError(t, code, out, "the store does not list its keys")
}
