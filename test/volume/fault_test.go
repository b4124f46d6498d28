package volume

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// enginesDir is where scripts/engines.sh keeps its engines' pids: the
// fault tests need engines they may kill, so they run only on those, and
// only when SHALE_VOLUME_FAULTS=1 says nothing else uses them meanwhile
// (scripts/test.sh runs them alone, after the other tests).
func enginesDir(t *testing.T) string {
	if os.Getenv("SHALE_VOLUME_FAULTS") != "1" {
		t.Skip("kills engines that other tests may be using: set SHALE_VOLUME_FAULTS=1 to run it alone")
	}
	dir := os.Getenv("SHALE_ENGINES_DIR")
	if dir == "" {
		dir = "/tmp/shale-engines"
	}
	if _, err := os.Stat(filepath.Join(dir, "m0.pid")); err != nil {
		t.Skip("the engines are not scripts/engines.sh's: no member to kill")
	}
	return dir
}

// TestEtcdMemberKilled: kill -9 of an etcd member during a workload; the
// volume goes on with the other two (a majority), and the member comes
// back and catches up.
func TestEtcdMemberKilled(t *testing.T) {
	dir := enginesDir(t)
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	step := func(i int) {
		t.Helper()
		p := filepath.Join(a, fmt.Sprint(i%7))
		data := bytes.Repeat([]byte{byte(i)}, 1000+i)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatalf("step %d: write: %v", i, err)
		}
		if err := os.Rename(p, p+"-r"); err != nil {
			t.Fatalf("step %d: rename: %v", i, err)
		}
		got, err := os.ReadFile(filepath.Join(b, fmt.Sprint(i%7)+"-r"))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("step %d: the other client read %d bytes, %v", i, len(got), err)
		}
	}
	for i := range 20 {
		step(i)
	}
	kill9(t, dir, "m0")
	start := time.Now()
	for i := 20; i < 60; i++ {
		step(i)
	}
	t.Logf("40 steps with a member dead took %v", time.Since(start))
	if out, err := exec.Command(shaleBin, "volume", "fsck", lower).CombinedOutput(); err != nil {
		t.Fatalf("fsck with a member dead: %v\n%s", err, out)
	}
}

// kill9 kills -9 the engine whose pid is in dir/NAME.pid (m0, s3...).
// restart starts the engines again; the test's cleanup does too, for the
// tests after it.
func kill9(t *testing.T, dir, name string) (restart func()) {
	t.Helper()
	restart = func() {
		if out, err := exec.Command(filepath.Join(repoRoot(t), "scripts", "engines.sh"), "start").CombinedOutput(); err != nil {
			t.Errorf("restarting the engines: %v: %s", err, out)
		}
	}
	t.Cleanup(restart)
	b, err := os.ReadFile(filepath.Join(dir, name+".pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := unix.Kill(pid, unix.SIGKILL); err != nil {
		t.Fatalf("kill -9 of %s (pid %d): %v", name, pid, err)
	}
	return restart
}

// repoRoot is the module's root, where scripts/ is.
func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// TestS3Gone: the S3 server killed for 10 s. A close that writes back
// waits and then lands; reads of blocks the client has cached go on.
func TestS3Gone(t *testing.T) {
	dir := enginesDir(t)
	lower := newVolume(t)
	a, b := mount(t, lower), mount(t, lower)
	old := bytes.Repeat([]byte("cached "), 5000)
	if err := os.WriteFile(filepath.Join(a, "old"), old, 0o644); err != nil {
		t.Fatal(err)
	}
	restart := kill9(t, dir, "s3")
	down := time.Now()
	data := bytes.Repeat([]byte("written while S3 was gone "), 3000)
	closed := make(chan error, 1)
	go func() { closed <- os.WriteFile(filepath.Join(a, "new"), data, 0o644) }()
	// Reads of what this client has cached go on meanwhile.
	if got, err := os.ReadFile(filepath.Join(a, "old")); err != nil || !bytes.Equal(got, old) {
		t.Fatalf("a cached file with S3 gone: %d bytes, %v", len(got), err)
	}
	select {
	case err := <-closed:
		t.Fatalf("the close returned with S3 gone (%v): it should wait for the write-back", err)
	case <-time.After(10 * time.Second):
	}
	restart()
	up := time.Now()
	if err := <-closed; err != nil {
		t.Fatalf("the write made while S3 was gone: %v", err)
	}
	t.Logf("S3 gone %v; the close returned %v after it came back", up.Sub(down).Round(time.Millisecond), time.Since(up).Round(time.Millisecond))
	if got, err := os.ReadFile(filepath.Join(b, "new")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the other client read %d bytes, %v; want the %d written", len(got), err, len(data))
	}
}

// TestS3GoneRemount: a mount with a disk cache writes a file and is
// unmounted; with the S3 server killed, a new mount on the same cache
// directory (as after a reboot) reads the file from disk.
func TestS3GoneRemount(t *testing.T) {
	dir := enginesDir(t)
	lower := newVolume(t)
	cache := t.TempDir()
	flags := []string{"--cache-dir", cache, "--cache-size", "64MiB"}
	a, umount := mountWith(t, lower, nil, flags...)
	data := bytes.Repeat([]byte("from the disk cache "), 4000) // 80,000 bytes: 5 blocks
	if err := os.WriteFile(filepath.Join(a, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	umount()
	kill9(t, dir, "s3")
	b, _ := mountWith(t, lower, nil, flags...)
	start := time.Now()
	if got, err := os.ReadFile(filepath.Join(b, "f")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("with S3 gone, a new mount read %d bytes (%v); want the %d bytes on disk", len(got), err, len(data))
	}
	t.Logf("read from the disk cache with S3 gone in %v", time.Since(start).Round(time.Millisecond))
}
