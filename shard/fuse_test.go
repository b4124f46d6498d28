package shard

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
)

// mountShard builds shale and mounts "shale mount --layer shard" over a
// new lower directory, until the test ends.
func mountShard(t *testing.T) (lower, mnt string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts FUSE file systems: run it as root")
	}
	if fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0); err != nil {
		t.Fatalf("no /dev/fuse: %v", err)
	} else {
		unix.Close(fd)
	}
	base := t.TempDir()
	bin, err := shaletest.Build(base)
	if err != nil {
		t.Fatal(err)
	}
	lower, mnt = filepath.Join(base, "lower"), filepath.Join(base, "mnt")
	for _, d := range []string{lower, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, bin, "mount", "--layer", "shard", lower, mnt)
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v\n%s", err, out)
			exec.Command("umount", "-l", mnt).Run()
		}
	})
	return lower, mnt
}

// run runs a command and returns its output, failing the test if it fails.
func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestMountedWithOrdinaryCommands mounts "shale mount --layer shard" and
// uses a managed directory with chmod, ls, mv and stat, as a user would.
func TestMountedWithOrdinaryCommands(t *testing.T) {
	lower, mnt := mountShard(t)
	big := filepath.Join(mnt, "big")
	run(t, "mkdir", big)
	// The mode checked below, whatever the umask (in-process hostfs
	// layers of other tests clear this process's).
	run(t, "chmod", "755", big)
	var want []string
	for i := range 300 {
		name := fmt.Sprintf("file%03d", i)
		if err := os.WriteFile(filepath.Join(big, name), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	run(t, "mkdir", filepath.Join(big, "sub"))
	want = append(want, "sub")
	slices.Sort(want)
	ls := func() []string {
		return strings.Fields(run(t, "ls", "-1", big))
	}

	run(t, "chmod", "u+s", big)
	if got := ls(); !slices.Equal(got, want) {
		t.Fatalf("ls after chmod u+s: %d entries, want %d", len(got), len(want))
	}
	if got := run(t, "stat", "-c", "%A %h", big); got != "drwsr-xr-x 3\n" {
		t.Errorf("stat of the managed dir: %q", got)
	}
	top, _ := os.ReadDir(filepath.Join(lower, "big"))
	for _, e := range top {
		if _, ok := bucketIndex(e.Name()); !ok {
			t.Errorf("lower top level holds %s", e.Name())
		}
	}
	if b, err := os.ReadFile(filepath.Join(big, "file123")); err != nil || string(b) != "file123" {
		t.Errorf("read through the managed dir: %q, %v", b, err)
	}

	// mv out of, into and within the managed directory.
	run(t, "mv", filepath.Join(big, "file001"), mnt)
	run(t, "mv", filepath.Join(mnt, "file001"), filepath.Join(big, "renamed"))
	run(t, "mv", filepath.Join(big, "file002"), filepath.Join(big, "sub"))
	want = slices.DeleteFunc(want, func(s string) bool { return s == "file001" || s == "file002" })
	want = append(want, "renamed")
	slices.Sort(want)
	if got := ls(); !slices.Equal(got, want) {
		t.Fatalf("ls after mv: %v", got)
	}

	// A listing open across deletions sees every survivor once.
	f, err := os.Open(big)
	if err != nil {
		t.Fatal(err)
	}
	first, err := f.Readdirnames(50)
	if err != nil {
		t.Fatal(err)
	}
	for i := 100; i < 300; i += 2 {
		os.Remove(filepath.Join(big, fmt.Sprintf("file%03d", i)))
	}
	rest, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, n := range append(first, rest...) {
		seen[n]++
	}
	for i := 101; i < 300; i += 2 {
		if n := fmt.Sprintf("file%03d", i); seen[n] != 1 {
			t.Errorf("%s seen %d times", n, seen[n])
		}
	}

	run(t, "chmod", "u-s", big)
	if got := run(t, "stat", "-c", "%A %h", big); got != "drwxr-xr-x 3\n" {
		t.Errorf("stat after chmod u-s: %q", got)
	}
	if got := ls(); len(got) != len(want)-100 {
		t.Errorf("ls after chmod u-s: %d entries, want %d", len(got), len(want)-100)
	}
	// rm -r empties a managed directory, then removes it and its buckets.
	run(t, "chmod", "u+s", big)
	run(t, "rm", "-r", big)
	if _, err := os.Stat(filepath.Join(lower, "big")); !os.IsNotExist(err) {
		t.Errorf("lower big after rm -r: %v", err)
	}
}

// errnoOf is the errno an os or unix call failed with, 0 on success.
func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if err == nil || !errors.As(err, &e) {
		return 0
	}
	return e
}

// TestMountedLongNames makes every call that names a component longer
// than NAME_MAX in a managed directory, an ordinary directory of the mount
// and a directory of the host, and wants ENAMETOOLONG from all three, as
// ext4 answers; and no bucket made for the name.
func TestMountedLongNames(t *testing.T) {
	lower, mnt := mountShard(t)
	managed, ordinary, host := filepath.Join(mnt, "m"), filepath.Join(mnt, "o"), t.TempDir()
	for _, d := range []string{managed, ordinary} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "chmod", "u+s", managed)
	for _, d := range []string{managed, ordinary, host} {
		if err := os.WriteFile(filepath.Join(d, "f"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 64)
	ts := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
	calls := []struct {
		what string
		call func(d, p string) error // d the directory, p the long path
	}{
		{"stat", func(d, p string) error { _, err := os.Lstat(p); return err }},
		{"stat beneath", func(d, p string) error { _, err := os.Lstat(filepath.Join(p, "x")); return err }},
		{"access", func(d, p string) error { return unix.Faccessat(unix.AT_FDCWD, p, unix.F_OK, unix.AT_SYMLINK_NOFOLLOW) }},
		{"open", func(d, p string) error { _, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0); return err }},
		{"create", func(d, p string) error {
			fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"mkdir", func(d, p string) error { return unix.Mkdir(p, 0o755) }},
		{"mknod", func(d, p string) error { return unix.Mknod(p, unix.S_IFIFO|0o644, 0) }},
		{"symlink", func(d, p string) error { return unix.Symlink("t", p) }},
		{"readlink", func(d, p string) error { _, err := unix.Readlink(p, buf); return err }},
		{"chmod", func(d, p string) error { return unix.Chmod(p, 0o600) }},
		{"chown", func(d, p string) error { return unix.Lchown(p, 0, 0) }},
		{"truncate", func(d, p string) error { return unix.Truncate(p, 0) }},
		{"utimes", func(d, p string) error { return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW) }},
		{"link from", func(d, p string) error { return unix.Link(p, filepath.Join(d, "g")) }},
		{"link to", func(d, p string) error { return unix.Link(filepath.Join(d, "f"), p) }},
		{"rename from", func(d, p string) error { return unix.Rename(p, filepath.Join(d, "g")) }},
		{"rename to", func(d, p string) error { return unix.Rename(filepath.Join(d, "f"), p) }},
		{"rmdir", func(d, p string) error { return unix.Rmdir(p) }},
		{"unlink", func(d, p string) error { return unix.Unlink(p) }},
		{"getxattr", func(d, p string) error { _, err := unix.Lgetxattr(p, "user.x", buf); return err }},
		{"setxattr", func(d, p string) error { return unix.Lsetxattr(p, "user.x", []byte("v"), 0) }},
		{"listxattr", func(d, p string) error { _, err := unix.Llistxattr(p, buf); return err }},
		{"removexattr", func(d, p string) error { return unix.Lremovexattr(p, "user.x") }},
	}
	// 256 bytes reach shale; the kernel itself refuses more than 1024.
	// Each call has a name of its own, so that none finds a bucket that
	// another made.
	for _, n := range []int{256, 1000} {
		for i, c := range calls {
			long := fmt.Sprintf("%02d", i) + strings.Repeat("n", n-2)
			want := errnoOf(c.call(host, filepath.Join(host, long)))
			if want != syscall.ENAMETOOLONG {
				t.Fatalf("%s of %d bytes on the host: %v, want ENAMETOOLONG", c.what, n, want)
			}
			for _, d := range []string{managed, ordinary} {
				if e := errnoOf(c.call(d, filepath.Join(d, long))); e != want {
					t.Errorf("%s of %d bytes in %s: %v, want %v", c.what, n, filepath.Base(d), e, want)
				}
			}
			b, _ := place(long)
			if _, err := os.Lstat(filepath.Join(lower, "m", bucketName(b))); !os.IsNotExist(err) {
				t.Errorf("%s of %d bytes made a bucket: %v", c.what, n, err)
			}
		}
	}
}

// TestMountedChownByOwner: the owner of a managed directory, not root,
// changes its group and owner and chmods it symbolically, side by side
// with the same on a host directory: the mode reads the same on both,
// the mark stays above and beneath, and the entries stay listed. chmod
// u-s by the owner still unmarks.
func TestMountedChownByOwner(t *testing.T) {
	lower, mnt := mountShard(t)
	host := t.TempDir()
	// The owner must reach both through the test's temporary directories.
	for _, d := range []string{filepath.Dir(filepath.Dir(mnt)), filepath.Dir(mnt), host} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	managed, plain := filepath.Join(mnt, "m"), filepath.Join(host, "m")
	want := []string{"a", "b", "c"}
	for _, d := range []string{managed, plain} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range want {
			if err := os.WriteFile(filepath.Join(d, n), []byte(n), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(d, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		run(t, "chmod", "u+s", d)
	}
	asOwner := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{65534, 100}}}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("as the owner: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	for _, step := range [][]string{
		{"chgrp", "100"},
		{"chown", "65534:65534"},
		{"chmod", "g+w"},
		{"chown", ":100"},
		{"chmod", "g+s"},
	} {
		for _, d := range []string{plain, managed} {
			asOwner(step[0], append(step[1:], d)...)
		}
		what := strings.Join(step, " ")
		got, ref := run(t, "stat", "-c", "%A %U %G", managed), run(t, "stat", "-c", "%A %U %G", plain)
		if got != ref {
			t.Errorf("after %s: %q, on the host %q", what, got, ref)
		}
		if st, err := os.Stat(filepath.Join(lower, "m")); err != nil || st.Mode()&os.ModeSetuid == 0 {
			t.Errorf("after %s the mark is gone beneath: %v", what, err)
		}
		if got := strings.Fields(run(t, "ls", managed)); !slices.Equal(got, want) {
			t.Errorf("after %s: ls %v", what, got)
		}
		if b, err := os.ReadFile(filepath.Join(managed, "b")); err != nil || string(b) != "b" {
			t.Errorf("after %s: read %q, %v", what, b, err)
		}
	}
	for _, d := range []string{plain, managed} {
		asOwner("chmod", "u-s", d)
	}
	if got, ref := run(t, "stat", "-c", "%A", managed), run(t, "stat", "-c", "%A", plain); got != ref {
		t.Errorf("after chmod u-s: %q, on the host %q", got, ref)
	}
	top, err := os.ReadDir(filepath.Join(lower, "m"))
	if err != nil || len(top) != len(want) {
		t.Errorf("after chmod u-s the lower holds %d entries, want %d (%v)", len(top), len(want), err)
	}
}
