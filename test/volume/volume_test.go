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
	"sync"
	"sync/atomic"
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
func mount(t *testing.T, lower string) string { return mountEnv(t, lower) }

// mountEnv is mount with variables for the serving process
// (SHALE_VOLUME_WATCH=off: a client that does not watch).
func mountEnv(t *testing.T, lower string, env ...string) string {
	mnt, _ := mountWith(t, lower, env)
	return mnt
}

// mountWith is mount with variables and flags; umount unmounts it before
// the test ends, as the test's cleanup does if it has not.
func mountWith(t *testing.T, lower string, env []string, flags ...string) (mnt string, umount func()) {
	t.Helper()
	mnt = t.TempDir()
	cmd := exec.Command(shaleBin, append(append([]string{"mount"}, flags...), lower, mnt)...)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("shale mount: %v: %s", err, out)
	}
	var once sync.Once
	umount = func() {
		once.Do(func() {
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
	}
	t.Cleanup(umount)
	return mnt, umount
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
// The reader does not watch: what close-to-open promises must hold
// without the watch (and fails without the open's version check).
func TestCloseToOpen(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mountEnv(t, lower, "SHALE_VOLUME_WATCH=off")
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

// TestReplaceByRename: a file replaced by renaming a new one over it (as
// editors and package managers save) reads new at the other client's next
// open, though its kernel still caches the name with the old file: the
// open of the removed file is ESTALE, and the kernel looks the name up
// again. The reader does not watch, so nothing else could tell it.
func TestReplaceByRename(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mountEnv(t, lower, "SHALE_VOLUME_WATCH=off")
	for round := range 10 {
		want := fmt.Sprintf("version %d %s", round, strings.Repeat("v", round*1000))
		if err := os.WriteFile(filepath.Join(a, "f.tmp"), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(a, "f.tmp"), filepath.Join(a, "f")); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(b, "f"))
		if err != nil || string(got) != want {
			t.Fatalf("round %d: the other client read %.20q (%d bytes), %v; want %.20q (%d bytes)", round, got, len(got), err, want, len(want))
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

// TestKillClientMidRename: a client killed (kill -9) while it renames,
// links and removes files among directories leaves the namespace whole:
// each operation was one transaction, done or not done.
func TestKillClientMidRename(t *testing.T) {
	lower := newVolume(t)
	a := mount(t, lower)
	for _, d := range []string{"x", "y", "x/sub"} {
		if err := os.Mkdir(filepath.Join(a, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 40 {
		if err := os.WriteFile(filepath.Join(a, "x", fmt.Sprint(i)), []byte("f"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The victim: a second mount in the foreground, so that its pid is ours.
	mnt := t.TempDir()
	victim := exec.Command(shaleBin, "mount", "-f", lower, mnt)
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(mnt, "x")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the victim's mount never came up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", mnt).Run() })
	stop := make(chan struct{})
	done := make(chan int)
	var moved atomic.Int64
	for w := range 4 {
		go func() {
			n := 0
			for {
				select {
				case <-stop:
					done <- n
					return
				default:
				}
				i := rand.IntN(40)
				dirs := []string{"x", "y", "x/sub"}
				from, to := dirs[rand.IntN(3)], dirs[rand.IntN(3)]
				p, q := filepath.Join(mnt, from, fmt.Sprint(i)), filepath.Join(mnt, to, fmt.Sprint(i))
				switch w {
				case 3:
					os.Link(p, q+"-link")
					os.Remove(q + "-link")
				default:
					if os.Rename(p, q) == nil {
						n++
						moved.Add(1)
					}
				}
				if w == 0 && rand.IntN(20) == 0 {
					os.Rename(filepath.Join(mnt, "x/sub"), filepath.Join(mnt, "y/sub")) // a directory too
					os.Rename(filepath.Join(mnt, "y/sub"), filepath.Join(mnt, "x/sub"))
				}
			}
		}()
	}
	// Kill once renames are under way: any moment of them will do.
	for deadline := time.Now().Add(60 * time.Second); moved.Load() < 30; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("only %d renames in a minute", moved.Load())
		}
	}
	victim.Process.Signal(unix.SIGKILL)
	exited := make(chan struct{})
	go func() { victim.Wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		// A thread of it stuck in the kernel (an invalidation waiting
		// for a lock a request of its dead mount holds): free it, so
		// that the run goes on, and say so.
		abortFuse(mnt)
		<-exited
		t.Errorf("the killed client did not exit within a minute: its mount had to be aborted")
	}
	close(stop)
	renames := 0
	for range 4 {
		renames += <-done
	}
	if renames == 0 {
		t.Fatal("no rename was done before the kill: the test tested nothing")
	}
	out, err := exec.Command(shaleBin, "volume", "fsck", lower).CombinedOutput()
	if err != nil {
		t.Fatalf("after kill -9 of a client mid-rename (%d renames done): %v\n%s", renames, err, out)
	}
	// And every file is still there, once.
	seen := map[string]int{}
	for _, d := range []string{"x", "y", "x/sub", "y/sub"} {
		names, _ := os.ReadDir(filepath.Join(a, d))
		for _, n := range names {
			if !n.IsDir() && !strings.HasSuffix(n.Name(), "-link") {
				seen[n.Name()]++
			}
		}
	}
	for i := range 40 {
		if seen[fmt.Sprint(i)] != 1 {
			t.Fatalf("file %d is named %d times after the kill", i, seen[fmt.Sprint(i)])
		}
	}
	t.Logf("%d renames before the kill; fsck: %s", renames, strings.TrimSpace(string(out)))
}

// abortFuse aborts the FUSE connection of the mount at mnt (fusectl).
func abortFuse(mnt string) {
	exec.Command("mount", "-t", "fusectl", "none", "/sys/fs/fuse/connections").Run()
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == mnt {
			_, minor, _ := strings.Cut(f[2], ":")
			os.WriteFile("/sys/fs/fuse/connections/"+minor+"/abort", []byte("1"), 0)
		}
	}
}

// TestFollow: a reader that keeps the file open (tail -f) sees what
// another client appends and closes, within a watch delivery, without
// opening it again.
func TestFollow(t *testing.T) {
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	if err := os.WriteFile(filepath.Join(a, "log"), []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := os.Open(filepath.Join(b, "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	want := "first\n"
	for i := range 5 {
		line := fmt.Sprintf("line %d %s\n", i, strings.Repeat("z", 20000))
		f, err := os.OpenFile(filepath.Join(a, "log"), os.O_WRONLY|os.O_APPEND, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(line)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		want += line
		eventually(t, fmt.Sprintf("append %d through the open file", i), func() (string, bool) {
			buf := make([]byte, len(want)+10)
			n, _ := r.ReadAt(buf, 0)
			return fmt.Sprintf("%d bytes", n), string(buf[:n]) == want
		})
	}
}
