// Package volume tests volumes (docs/volume.md) through real FUSE mounts
// of `shale mount etcd://…/NAME`, over the real engines SHALE_ETCD and
// SHALE_S3 name (scripts/engines.sh starts them on loopback): two mounts
// are two clients, each with its own caches, as on two machines.
package volume

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
)

var shaleBin string

func TestMain(m *testing.M) {
	if os.Getenv("SHALE_ETCD") == "" || os.Getenv("SHALE_S3") == "" {
		if os.Getenv("CI") != "" {
			fmt.Fprintln(os.Stderr, "test/volume: SHALE_ETCD and SHALE_S3 are not set: eval \"$(scripts/engines.sh start)\" first")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "test/volume: SHALE_ETCD and SHALE_S3 are not set: skipped (eval \"$(scripts/engines.sh start)\")")
		os.Exit(0)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "test/volume mounts FUSE file systems: run it as root")
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "shale-volume-bin")
	if err != nil {
		panic(err)
	}
	if shaleBin, err = shaletest.Build(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newVolume formats a volume with small blocks, so that files span
// several, and returns its address.
func newVolume(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("tv%d-%x", os.Getpid(), rand.Uint64())
	lower := "etcd://" + os.Getenv("SHALE_ETCD") + "/" + name
	data := strings.TrimSuffix(os.Getenv("SHALE_S3"), "/") + "/" + name
	if out, err := exec.Command(shaleBin, "format", "--block-size", "16KiB", "--data", data, lower).CombinedOutput(); err != nil {
		t.Fatalf("shale format: %v: %s", err, out)
	}
	return lower
}

// mount mounts lower at a new directory, as a client of its own.
func mount(t *testing.T, lower string) string {
	t.Helper()
	mnt := t.TempDir()
	if out, err := exec.Command(shaleBin, "mount", lower, mnt).CombinedOutput(); err != nil {
		t.Fatalf("shale mount: %v: %s", err, out)
	}
	t.Cleanup(func() {
		for deadline := time.Now().Add(30 * time.Second); ; {
			out, err := exec.Command(shaleBin, "umount", mnt).CombinedOutput()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("shale umount %s: %v: %s", mnt, err, out)
				exec.Command("umount", "-l", mnt).Run()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return mnt
}

// eventually polls cond until it holds, for changes that reach another
// client by etcd's watch: a delivery, not a timeout, but asynchronous.
func eventually(t *testing.T, what string, cond func() (string, bool)) time.Duration {
	t.Helper()
	start := time.Now()
	var got string
	for time.Since(start) < 20*time.Second {
		var ok bool
		if got, ok = cond(); ok {
			return time.Since(start)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s: never seen on the other client (last: %s)", what, got)
	return 0
}

// TestCloseToOpen: what one client writes and closes, the other reads at
// its next open, at once, though its kernel kept the old pages (the open
// finds the new version and drops them before it returns).
func TestCloseToOpen(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	pa, pb := filepath.Join(a, "f"), filepath.Join(b, "f")
	if err := os.WriteFile(pa, []byte("first version"), 0o644); err != nil {
		t.Fatal(err)
	}
	for round := range 20 {
		// b caches the file's pages and attributes.
		if _, err := os.ReadFile(pb); err != nil {
			t.Fatal(err)
		}
		want := bytes.Repeat([]byte{byte('a' + round)}, 1+rand.IntN(50000))
		if round%2 == 0 {
			want[0] = 'X' // same size sometimes: a size check alone would not tell
		}
		if err := os.WriteFile(pa, want, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(pb)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: the other client read %d bytes (%.10q…), want %d (%.10q…)", round, len(got), got, len(want), want)
		}
	}
}

// TestAppend: O_APPEND writes on one client, each closed, show whole on
// the other.
func TestAppend(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	var want []byte
	for i := range 30 {
		line := fmt.Sprintf("line %d %s\n", i, strings.Repeat("y", i*700))
		f, err := os.OpenFile(filepath.Join(a, "log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		want = append(want, line...)
		got, err := os.ReadFile(filepath.Join(b, "log"))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("after append %d the other client read %d bytes, want %d", i, len(got), len(want))
		}
	}
}

// TestNamespace: names, links, modes, xattrs and removals made on one
// client reach the other's kernel by the watch, though it caches names
// and attributes for an hour.
func TestNamespace(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	A := func(p string) string { return filepath.Join(a, p) }
	B := func(p string) string { return filepath.Join(b, p) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	stat := func(p string) (unix.Stat_t, error) {
		var st unix.Stat_t
		return st, unix.Lstat(p, &st)
	}
	must(os.Mkdir(A("d1"), 0o755))
	must(os.Mkdir(A("d2"), 0o755))
	must(os.WriteFile(A("d1/f"), []byte("data"), 0o644))
	// b looks, so that its kernel caches the names and attributes.
	eventually(t, "d1/f", func() (string, bool) { _, err := stat(B("d1/f")); return fmt.Sprint(err), err == nil })
	stat(B("d2/g"))

	var worst time.Duration
	seen := func(d time.Duration) { worst = max(worst, d) }

	must(os.Rename(A("d1/f"), A("d2/g")))
	seen(eventually(t, "rename across directories", func() (string, bool) {
		_, err1 := stat(B("d1/f"))
		_, err2 := stat(B("d2/g"))
		return fmt.Sprint(err1, err2), err1 != nil && err2 == nil
	}))
	must(os.Link(A("d2/g"), A("d1/h")))
	seen(eventually(t, "link count", func() (string, bool) {
		st, err := stat(B("d2/g"))
		return fmt.Sprint(st.Nlink, err), err == nil && st.Nlink == 2
	}))
	must(os.Symlink("d2/g", A("s")))
	seen(eventually(t, "symlink", func() (string, bool) {
		target, err := os.Readlink(B("s"))
		return target, err == nil && target == "d2/g"
	}))
	must(os.Chmod(A("d2/g"), 0o600))
	seen(eventually(t, "chmod", func() (string, bool) {
		st, err := stat(B("d1/h"))
		return fmt.Sprintf("%o", st.Mode), err == nil && st.Mode&0o777 == 0o600
	}))
	must(unix.Setxattr(A("d2/g"), "user.k", []byte("v1"), 0))
	seen(eventually(t, "xattr", func() (string, bool) {
		buf := make([]byte, 10)
		n, err := unix.Getxattr(B("d2/g"), "user.k", buf)
		return fmt.Sprint(string(buf[:max(n, 0)]), err), err == nil && string(buf[:n]) == "v1"
	}))
	must(os.Truncate(A("d2/g"), 2))
	seen(eventually(t, "truncate", func() (string, bool) {
		st, err := stat(B("d2/g"))
		return fmt.Sprint(st.Size, err), err == nil && st.Size == 2
	}))
	must(os.Remove(A("d1/h")))
	must(os.Rename(A("d2"), A("d1/d2")))
	seen(eventually(t, "directory moved", func() (string, bool) {
		st, err := stat(B("d1"))
		_, err2 := stat(B("d1/d2/g"))
		return fmt.Sprint(st.Nlink, err, err2), err == nil && st.Nlink == 3 && err2 == nil
	}))
	must(os.RemoveAll(A("d1")))
	seen(eventually(t, "removal", func() (string, bool) {
		names, err := os.ReadDir(b)
		return fmt.Sprint(len(names), err), err == nil && len(names) == 1 // s
	}))
	t.Logf("the slowest change reached the other client in %v", worst)
}

// TestSparse: a file with a hole, written on one client, reads back with
// zeros in the hole on the other.
func TestSparse(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	f, err := os.Create(filepath.Join(a, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("head"), 0)
	f.WriteAt([]byte("tail"), 1<<20)
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(b, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 1<<20+4)
	copy(want, "head")
	copy(want[1<<20:], "tail")
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written with a hole", len(got), len(want))
	}
	var st unix.Stat_t
	unix.Stat(filepath.Join(b, "sparse"), &st)
	if st.Blocks*512 > 1<<18 {
		t.Fatalf("the hole takes space: %d blocks", st.Blocks)
	}
}
