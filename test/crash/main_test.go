// Package crash kills the serving process of real shale mounts (kill -9)
// in the middle of a random workload, again and again, and checks after
// each remount what docs/crash-safety.md promises: every operation that
// returned before the kill is kept, the one in flight is either done or
// not (for crypt, the blocks it was writing may also fail to read), every
// file, directory and symlink reads without error, and the lower
// directory holds no inconsistent layer files (directory IDs, long-name
// sidecars, shard buckets).
//
// Work is bounded by operations (cycles, operations per cycle); the
// timeouts here are hang guards, reported as hangs. It needs root and
// /dev/fuse, and fails without them.
package crash

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/internal/shaletest"
)

// shaleBin is the shale binary built by TestMain.
var shaleBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	unix.Umask(0o022) // the model's modes are 0644 and 0755
	tmp, err := os.MkdirTemp("", "shale-crash-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	if shaleBin, err = shaletest.Build(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "crash:", err)
		return 1
	}
	return m.Run()
}

// requireMountable fails (never skips) the test without root or /dev/fuse.
func requireMountable(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("must run as root (euid is %d): the test mounts shale with allow_other and kills its serving process", os.Geteuid())
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR, 0)
	if err != nil {
		t.Fatalf("cannot open /dev/fuse: %v (load the fuse module: modprobe fuse)", err)
	}
	unix.Close(fd)
}

// hangGuard is how long one step (a mount becoming ready, a killed
// process ending, a check of the tree, one operation of the workload) may
// take before it is reported as a hang; each takes milliseconds to a
// second.
const hangGuard = time.Minute

// A server is one `shale mount -f`, a child of the test.
type server struct {
	cmd  *exec.Cmd
	mnt  string
	dev  string      // the mount's device number, major:minor
	log  *syncBuffer // the serving process's log (stderr)
	done chan struct{}
	err  error // how it ended, once done is closed

	killOnce sync.Once
	mu       sync.Mutex
	hangs    []string // hangs seen by the watchdogs, for the test to report
}

// syncBuffer is the serving process's stderr: written by exec's copying
// goroutine, read by the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startServer mounts through args (shale mount's) in the foreground, and
// returns once the server logs that it is mounted. The mount shows in
// mountinfo earlier, while the server still opens and stats its own
// mountpoint (go-fuse's poll check, the readahead setting): killed then,
// it waits at exit for requests to itself that nobody will answer, and
// wedges (see docs/crash-safety.md). Killing it then is not what this
// test is about.
func startServer(t *testing.T, mnt string, args ...string) *server {
	t.Helper()
	s := &server{mnt: mnt, log: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(shaleBin, append([]string{"mount", "-f"}, args...)...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.WaitDelay = hangGuard
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("starting shale mount: %v", err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() { s.stop(t) })
	guard := time.After(hangGuard)
	for !strings.Contains(s.log.String(), "msg=mounted") {
		select {
		case <-s.done:
			t.Fatalf("shale mount %s ended before the mount was ready: %v\n%s", strings.Join(args, " "), s.err, s.log)
		case <-guard:
			t.Fatalf("hang: shale mount %s not ready after %v\n%s", strings.Join(args, " "), hangGuard, s.log)
		case <-time.After(5 * time.Millisecond):
		}
	}
	var fstype string
	if fstype, s.dev = mountAt(mnt); fstype != "fuse.shale" {
		t.Fatalf("shale mount logged that it is mounted, but %s is %q", mnt, fstype)
	}
	return s
}

// kill ends the serving process with SIGKILL; the kernel then fails the
// requests in flight and every later one. Should the process not end (a
// thread of it waiting for a request to its own mount, which only it
// could answer), a watchdog aborts its FUSE connection, which frees
// every request, and records a hang.
func (s *server) kill() {
	s.killOnce.Do(func() {
		s.cmd.Process.Signal(syscall.SIGKILL)
		go func() {
			select {
			case <-s.done:
			case <-time.After(hangGuard):
				threads := threadStates(s.cmd.Process.Pid)
				err := abortConn(s.dev)
				s.hang(fmt.Sprintf("the serving process did not end within %v of SIGKILL; its threads (tid, state, wait channel):\n%s\naborting its FUSE connection: %v", hangGuard, threads, err))
			}
		}()
	})
}

func (s *server) hang(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hangs = append(s.hangs, what)
}

// reportHangs fails t with the hangs the watchdogs saw.
func (s *server) reportHangs(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range s.hangs {
		t.Errorf("hang: %s", h)
	}
	s.hangs = nil
}

// watch guards a step of the test that uses the mount: if it is not over
// within hangGuard, the server is killed (and its connection aborted if
// it will not die), so that the step's system calls fail instead of
// waiting forever. The returned func ends the watch.
func (s *server) watch(step string) (end func()) {
	stop := make(chan struct{})
	go func() {
		select {
		case <-stop:
		case <-time.After(hangGuard):
			s.hang(fmt.Sprintf("%s took over %v; the server was killed", step, hangGuard))
			s.kill()
		}
	}()
	return func() { close(stop) }
}

// wait waits for the process to end after kill or unmount.
func (s *server) wait(t *testing.T, after string) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(2 * hangGuard): // the kill watchdog aborts after one
		s.reportHangs(t)
		t.Fatalf("hang: the serving process did not end within %v of %s", 2*hangGuard, after)
	}
	s.reportHangs(t)
}

// detach waits for the killed process to end and lazily unmounts its
// dead mount, as fusermount3 -uz would.
func (s *server) detach(t *testing.T) {
	t.Helper()
	s.wait(t, "SIGKILL")
	var exit *exec.ExitError
	if !errors.As(s.err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the serving process ended with %v, not by the kill\n%s", s.err, s.log)
	}
	if err := unix.Unmount(s.mnt, unix.MNT_DETACH); err != nil {
		t.Fatalf("umount -l %s: %v", s.mnt, err)
	}
	if fstype, _ := mountAt(s.mnt); fstype != "" {
		t.Fatalf("%s is still mounted (%s) after umount -l", s.mnt, fstype)
	}
}

// unmount ends the server cleanly: shale umount, then it must exit 0.
func (s *server) unmount(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	if out, err := exec.CommandContext(ctx, shaleBin, "umount", s.mnt).CombinedOutput(); err != nil {
		t.Fatalf("shale umount %s: %v\n%s", s.mnt, err, out)
	}
	end := s.watch("ending after shale umount")
	s.wait(t, "shale umount")
	end()
	if s.err != nil {
		t.Errorf("the serving process ended with %v after shale umount\n%s", s.err, s.log)
	}
}

// stop is the cleanup of a test that ended early: kill and detach.
func (s *server) stop(t *testing.T) {
	select {
	case <-s.done:
	default:
		s.kill()
		<-s.done
	}
	if fstype, _ := mountAt(s.mnt); fstype != "" {
		if err := unix.Unmount(s.mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("umount -l %s: %v", s.mnt, err)
		}
	}
}

// threadStates lists the threads of process pid: id, state and the
// kernel function it waits in.
func threadStates(pid int) string {
	var b strings.Builder
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		st, _ := os.ReadFile(filepath.Join(task, "stat"))
		wchan, _ := os.ReadFile(filepath.Join(task, "wchan"))
		f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
		if len(f) > 0 {
			fmt.Fprintf(&b, "  %s %s %s\n", filepath.Base(task), f[0], wchan)
		}
	}
	return b.String()
}

// abortConn aborts the FUSE connection of device dev (major:minor) through
// the fusectl file system, mounting it if need be.
func abortConn(dev string) error {
	const ctl = "/sys/fs/fuse/connections"
	_, minor, _ := strings.Cut(dev, ":")
	abort := filepath.Join(ctl, minor, "abort")
	if _, err := os.Stat(abort); os.IsNotExist(err) {
		if err := unix.Mount("fusectl", ctl, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("mounting fusectl: %w", err)
		}
	}
	return os.WriteFile(abort, []byte("1"), 0)
}

// mountAt returns the type and device number (major:minor) of the file
// system mounted at dir, or "", "".
func mountAt(dir string) (fstype, dev string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root mountpoint options... - fstype ...
		f := strings.Fields(line)
		if len(f) < 5 || f[4] != dir {
			continue
		}
		for i, w := range f {
			if w == "-" && i+1 < len(f) {
				fstype, dev = f[i+1], f[2]
			}
		}
	}
	return fstype, dev
}
