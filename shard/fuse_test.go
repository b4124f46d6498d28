package shard

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
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
	bin := filepath.Join(base, "shale")
	build := exec.Command("go", "build", "-o", bin, "github.com/shalefs/shale/cmd/shale")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
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
