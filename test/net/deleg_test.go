package net

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// Three mounts of a server that delegates (issue 27). A makes a file
// and, keeping it open for writing, reads it back through new opens: the
// delegation granted at its open for writing answers all but the first
// without a request (before, none was granted while the file was open for writing,
// and each was a walk, a Tlopen and a clunk). B then reads what A wrote
// (A's delayed writes come back first); C writes over it, which takes
// A's delegation back; A's and B's next opens read C's bytes, and A's
// listing of the directory (cached, its opens waiting for a Treaddir)
// shows C's new name.
func TestDelegationWriterThreeClients(t *testing.T) {
	_, _, addr, url := spriteServer(t, "--delegate")
	a, b, c := mount(t, url), mount(t, url), mount(t, url)
	if err := os.Mkdir(filepath.Join(a, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	in := func(mnt string, name string) string { return filepath.Join(mnt, "d", name) }
	data := randomBytes(t, 100<<10+7)
	f, err := os.OpenFile(in(a, "f"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	before := spriteStats(t, a)
	for range 3 {
		if got := mustRead(t, in(a, "f")); !bytes.Equal(got, data) {
			t.Fatalf("A reads %d bytes back, equal %v; wrote %d", len(got), bytes.Equal(got, data), len(data))
		}
	}
	after := spriteStats(t, a)
	// The first asks the server: a creator may write what its mode
	// forbids it to read, so the create shows nothing of the reads.
	if n := num(after, "opens_delegated") - num(before, "opens_delegated"); n < 2 {
		t.Fatalf("A's 3 opens of a file it alone has open for writing: %v delegated, want 2\nA: %v", n, after)
	}
	if got := mustRead(t, in(b, "f")); !bytes.Equal(got, data) {
		t.Fatalf("B reads %d bytes of what A wrote, equal %v; A wrote %d", len(got), bytes.Equal(got, data), len(data))
	}
	if got := names(t, filepath.Join(a, "d")); !slices.Equal(got, []string{"f"}) {
		t.Fatalf("A lists %q", got)
	}
	newer := randomBytes(t, 50<<10)
	writeFile(t, in(c, "f"), newer, 0o644)
	writeFile(t, in(c, "g"), nil, 0o644)
	for _, m := range []string{a, b} {
		if got := mustRead(t, in(m, "f")); !bytes.Equal(got, newer) {
			t.Fatalf("%s reads %d bytes after C's write, equal %v; C wrote %d", m, len(got), bytes.Equal(got, newer), len(newer))
		}
	}
	if got := names(t, filepath.Join(a, "d")); !slices.Equal(got, []string{"f", "g"}) {
		t.Fatalf("A lists %q after C's create, want [f g]", got)
	}
	if num(spriteStats(t, a), "delegations_returned") < 1 {
		t.Errorf("A gave back no delegation to C's open for writing: %v", spriteStats(t, a))
	}
	if ss := serverStats(t, addr); ss["sprite.recall.timeouts"] != 0 {
		t.Errorf("the server gave up %d recalls or returns", ss["sprite.recall.timeouts"])
	}
}

// A's shared flock of a file it holds a delegation of is kept on A (no
// request), and B's exclusive one is refused while A holds it: B's open
// for writing takes A's delegation back, and the lock with it. Once A's
// goes, B's is granted, and A's next shared one waits for B's.
func TestKeptLocksAcrossMounts(t *testing.T) {
	_, _, _, url := spriteServer(t, "--delegate")
	a, b := mount(t, url), mount(t, url)
	writeFile(t, filepath.Join(a, "f"), []byte("data"), 0o644)
	mustRead(t, filepath.Join(a, "f")) // the creator's first open for reading asks
	fa, err := os.Open(filepath.Join(a, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	before := spriteStats(t, a)
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_SH); err != nil {
		t.Fatalf("A's shared flock: %v", err)
	}
	if n := num(spriteStats(t, a), "locks_kept") - num(before, "locks_kept"); n != 1 {
		t.Fatalf("A's shared flock under its delegation: %v lock calls kept, want 1", n)
	}
	fb, err := os.OpenFile(filepath.Join(b, "f"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("B's exclusive flock while A holds a shared one: %v, want EWOULDBLOCK", err)
	}
	if n := num(spriteStats(t, a), "locks_pushed"); n != 1 {
		t.Fatalf("A pushed %v locks, want 1", n)
	}
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_UN); err != nil {
		t.Fatalf("A's unlock: %v", err)
	}
	if err := unix.Flock(int(fb.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("B's exclusive flock once A's went: %v", err)
	}
	if err := unix.Flock(int(fa.Fd()), unix.LOCK_SH|unix.LOCK_NB); err != unix.EWOULDBLOCK {
		t.Fatalf("A's shared flock while B holds an exclusive one: %v, want EWOULDBLOCK", err)
	}
}

// names is the sorted listing of dir.
func names(t *testing.T, dir string) []string {
	t.Helper()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ns, err := d.Readdirnames(-1)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ns)
	return ns
}
