package crypt

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/layer"
)

// Symlink targets too long to fit a lower symlink once encrypted (over
// 3043 bytes): through a FUSE mount beside a native directory, and through
// the layer with its lower files tampered with.

// linkSidecarPrefix starts the name of a long target's sidecar.
const linkSidecarPrefix = ".shale.T."

// standIn is what docs/crypt-format.md says a long target is stored as:
// the sidecar's name, in LOWER's root, and the lower symlink's target, the
// name padded with '/' to 4095 bytes.
func standIn(stored []byte) (sidecar, target string) {
	sum := sha256.Sum256(stored)
	sidecar = linkSidecarPrefix + base64.RawURLEncoding.EncodeToString(sum[:])
	return sidecar, sidecar + strings.Repeat("/", 4095-len(sidecar))
}

// mountStack mounts the layer of a new stack. Entries and attributes are
// not cached by the kernel, so every stat reaches the layer.
func mountStack(t *testing.T) (*tstack, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts FUSE file systems: run it as root")
	}
	s := newStack(t)
	mnt := t.TempDir()
	srv, err := fuseview.Mount(mnt, s.st, s.root, fuseview.Options{Source: s.lower})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	return s, mnt
}

// linkTarget is n random bytes, none of them NUL.
func linkTarget(r *rand.Rand, n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(1 + r.IntN(255))
	}
	return string(b)
}

// errno names the errno in err, or OK.
func errno(err error) string {
	var e syscall.Errno
	switch {
	case err == nil:
		return "OK"
	case errors.As(err, &e):
		return unix.ErrnoName(e)
	}
	return err.Error()
}

// sidecars lists the long-target sidecars in lower.
func sidecars(t *testing.T, lower string) []string {
	t.Helper()
	ents, err := os.ReadDir(lower)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), linkSidecarPrefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// Each length as ext4 answers it: symlink's errno, readlink's bytes and
// lstat's size; and the layer's own files stay out of the listing.
func TestMountedLongTargetsAsExt4(t *testing.T) {
	s, mnt := mountStack(t)
	native := t.TempDir()
	r := rand.New(rand.NewPCG(15, 16))
	for _, n := range []int{1, 3042, 3043, 3044, 4000, 4094, 4095, 4096, 5000} {
		target := linkTarget(r, n)
		var got [2]string
		for i, dir := range []string{native, mnt} {
			p := filepath.Join(dir, fmt.Sprint("l", n))
			serr := unix.Symlink(target, p)
			back, rerr := os.Readlink(p)
			var st unix.Stat_t
			lerr := unix.Lstat(p, &st)
			got[i] = fmt.Sprintf("symlink %s, readlink %s same %v, lstat %s size %d", errno(serr), errno(rerr), back == target, errno(lerr), st.Size)
		}
		if got[0] != got[1] {
			t.Errorf("target of %d bytes:\n ext4:  %s\n crypt: %s", n, got[0], got[1])
		}
	}
	list := func(dir string) []string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	if a, b := list(native), list(mnt); !slices.Equal(a, b) {
		t.Errorf("ext4 lists %q, crypt %q", a, b)
	}
	if got := sidecars(t, s.lower); len(got) != 4 { // 3044, 4000, 4094 and 4095 bytes
		t.Errorf("LOWER holds %d long-target sidecars, want 4", len(got))
	}
}

// Renames and hard links of long-target symlinks, and removals and
// replacements of their links: every name reads its target as on ext4,
// and a target's sidecar goes with its last link.
func TestMountedLongTargetLinks(t *testing.T) {
	s, mnt := mountStack(t)
	native := t.TempDir()
	r := rand.New(rand.NewPCG(17, 18))
	t1, t2 := linkTarget(r, 4000), linkTarget(r, 3500)
	past := unix.Timespec{Sec: 1_000_000_000, Nsec: 5}
	steps := []struct {
		what string
		do   func(p func(string) string) error
	}{
		{"symlink a", func(p func(string) string) error { return os.Symlink(t1, p("a")) }},
		{"symlink b", func(p func(string) string) error { return os.Symlink(t2, p("b")) }},
		{"mkdir d", func(p func(string) string) error { return os.Mkdir(p("d"), 0o755) }},
		{"rename a d/a2", func(p func(string) string) error { return os.Rename(p("a"), p("d/a2")) }},
		{"link d/a2 c", func(p func(string) string) error { return os.Link(p("d/a2"), p("c")) }},
		{"rename d/a2 onto its twin c", func(p func(string) string) error { return os.Rename(p("d/a2"), p("c")) }},
		// Times set stick: stat must not read the link (which would
		// touch its access time) to learn its size.
		{"utimensat d/a2", func(p func(string) string) error {
			if err := unix.UtimesNanoAt(unix.AT_FDCWD, p("d/a2"), []unix.Timespec{past, past}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
			var st unix.Stat_t
			if err := unix.Lstat(p("d/a2"), &st); err != nil {
				return err
			}
			if st.Atim != past || st.Mtim != past {
				return fmt.Errorf("atime %v mtime %v after setting both to %v", st.Atim, st.Mtim, past)
			}
			return nil
		}},
		{"rename b onto c", func(p func(string) string) error { return os.Rename(p("b"), p("c")) }},
		{"rename c onto itself", func(p func(string) string) error { return os.Rename(p("c"), p("c")) }},
		{"exchange c and d/a2", func(p func(string) string) error {
			return unix.Renameat2(unix.AT_FDCWD, p("c"), unix.AT_FDCWD, p("d/a2"), unix.RENAME_EXCHANGE)
		}},
		{"unlink d/a2", func(p func(string) string) error { return os.Remove(p("d/a2")) }},
		{"link c e", func(p func(string) string) error { return os.Link(p("c"), p("e")) }},
		{"unlink c", func(p func(string) string) error { return os.Remove(p("c")) }},
	}
	// state shows every symlink: its target (which of t1 and t2), link
	// count and size.
	state := func(root string) string {
		var lines []string
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Type() != os.ModeSymlink {
				return err
			}
			var st unix.Stat_t
			lerr := unix.Lstat(p, &st)
			back, rerr := os.Readlink(p)
			which := map[string]string{t1: "t1", t2: "t2"}[back]
			lines = append(lines, fmt.Sprintf("%s -> %s %s, lstat %s nlink %d size %d",
				p[len(root):], which, errno(rerr), errno(lerr), st.Nlink, st.Size))
			return nil
		})
		return strings.Join(lines, "; ")
	}
	wantSidecars := []int{1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1}
	for i, step := range steps {
		var got [2]string
		for j, dir := range []string{native, mnt} {
			err := step.do(func(rel string) string { return filepath.Join(dir, rel) })
			got[j] = errno(err) + ": " + state(dir)
		}
		if got[0] != got[1] {
			t.Errorf("after %s:\n ext4:  %s\n crypt: %s", step.what, got[0], got[1])
		}
		if k := len(sidecars(t, s.lower)); k != wantSidecars[i] {
			t.Errorf("after %s: %d sidecars in LOWER, want %d", step.what, k, wantSidecars[i])
		}
	}
	if err := os.Remove(filepath.Join(mnt, "e")); err != nil {
		t.Fatal(err)
	}
	if got := sidecars(t, s.lower); len(got) != 0 {
		t.Errorf("sidecars left behind: %q", got)
	}
}

// The lower files of a long target are as docs/crypt-format.md says, and
// tampering with them fails readlink with EIO, never gives another target.
func TestLongTargetFormatAndTamper(t *testing.T) {
	s := newStack(t)
	r := rand.New(rand.NewPCG(19, 20))
	targets := map[string]string{"x": linkTarget(r, 4000), "y": linkTarget(r, 3500), "z": linkTarget(r, 4095), "short": linkTarget(r, 3043)}
	var a layer.Attr
	for name, target := range targets {
		if _, e := s.root.Symlink(ctx, []byte(target), name, &a); e != 0 {
			t.Fatalf("symlink %s: %v", name, e)
		}
		if a.Size != uint64(len(target)) {
			t.Errorf("%s: size %d, want %d", name, a.Size, len(target))
		}
	}
	if _, e := s.root.Symlink(ctx, make([]byte, 4096), "too long", &a); e != syscall.ENAMETOOLONG {
		t.Errorf("symlink of 4096 bytes: %v, want ENAMETOOLONG", e)
	}
	if _, e := s.root.Symlink(ctx, []byte(targets["x"]), "y", &a); e != syscall.EEXIST {
		t.Errorf("symlink over an existing name: %v, want EEXIST", e)
	}
	if got := sidecars(t, s.lower); len(got) != 3 {
		t.Errorf("LOWER holds %d long-target sidecars, want 3 (x, y, z)", len(got))
	}
	sidecar := map[string]string{}
	for name, target := range targets {
		lt, err := os.Readlink(s.lowerPath(name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "short" { // stored as it always was
			if got, err := s.l.DecodeLink([]byte(lt)); err != nil || string(got) != target {
				t.Errorf("the 3043-byte target is not stored in its lower symlink: %v", err)
			}
			continue
		}
		side, _, _ := strings.Cut(lt, "/")
		stored, err := os.ReadFile(filepath.Join(s.lower, side))
		if err != nil {
			t.Fatalf("%s: the sidecar named by its lower target: %v", name, err)
		}
		if wantSide, wantTarget := standIn(stored); side != wantSide || lt != wantTarget {
			t.Errorf("%s: lower target %.60q…, sidecar %q; want %.60q…", name, lt, side, wantTarget)
		}
		if got, err := s.l.DecodeLink(stored); err != nil || string(got) != target {
			t.Errorf("%s: the sidecar does not decode to the target: %v", name, err)
		}
		sidecar[name] = filepath.Join(s.lower, side)
	}
	readlink := func(name string) ([]byte, layer.Errno) {
		t.Helper()
		n, e := s.root.Lookup(ctx, name, &a)
		if e != 0 {
			t.Fatalf("lookup %s: %v", name, e)
		}
		defer n.Forget()
		return n.Readlink(ctx)
	}
	// The kernel never passes this on; a layer above might.
	if e := s.root.Rename(ctx, "x", s.root, "x", 0); e != 0 {
		t.Errorf("rename x onto itself: %v", e)
	}
	for name, target := range targets {
		if got, e := readlink(name); e != 0 || string(got) != target {
			t.Errorf("readlink %s before tampering: %v", name, e)
		}
	}

	// Swapped sidecars: each holds a valid target, of the other link.
	bx, _ := os.ReadFile(sidecar["x"])
	by, _ := os.ReadFile(sidecar["y"])
	os.Chmod(sidecar["x"], 0o644)
	os.Chmod(sidecar["y"], 0o644)
	if os.WriteFile(sidecar["x"], by, 0o644) != nil || os.WriteFile(sidecar["y"], bx, 0o644) != nil {
		t.Fatal("swap the sidecars")
	}
	// A sidecar gone.
	os.Remove(sidecar["z"])
	for _, name := range []string{"x", "y", "z"} {
		if got, e := readlink(name); e != syscall.EIO {
			t.Errorf("readlink %s after tampering = %d bytes, %v; want EIO", name, len(got), e)
		}
	}
	if got, e := readlink("short"); e != 0 || string(got) != targets["short"] {
		t.Errorf("readlink of the untouched short link: %v", e)
	}
	// The right sidecar back, behind a stand-in altered in its padding.
	if err := os.WriteFile(sidecar["x"], bx, 0o444); err != nil {
		t.Fatal(err)
	}
	if got, e := readlink("x"); e != 0 || string(got) != targets["x"] {
		t.Errorf("readlink x with its sidecar restored: %v", e)
	}
	lt, _ := os.Readlink(s.lowerPath("x"))
	os.Remove(s.lowerPath("x"))
	if err := os.Symlink(lt[:len(lt)-1]+"x", s.lowerPath("x")); err != nil {
		t.Fatal(err)
	}
	if got, e := readlink("x"); e != syscall.EIO {
		t.Errorf("readlink of an altered stand-in = %d bytes, %v; want EIO", len(got), e)
	}
}
