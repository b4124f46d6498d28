package conformance

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A program running from a file holds it against writing: opens for
// writing and truncations fail with ETXTBSY, and the file is left whole.
// pjdfstest's open::etxtbsy failed now and then on FUSE mounts: its open
// with O_RDONLY|O_TRUNC raced the program's start and emptied the file
// under it (the kernel checks only after OPEN, where the view truncates).
// Here the truncating open comes after the start, so the case fails every
// time the file is emptied.
var _ = addCases(
	testCase{"exec-running", func(t *testing.T, e *env) {
		prog, err := os.ReadFile("/usr/bin/sleep")
		e.Must(err, "read /usr/bin/sleep")
		e.Must(os.WriteFile(e.P("prog"), prog, 0o700), "write prog")
		e.Must(unix.Chmod(e.P("prog"), 0o755), "chmod prog")
		cmd := exec.Command(e.P("prog"), "60")
		e.Must(cmd.Start(), "run prog")
		defer cmd.Wait()
		defer cmd.Process.Kill()
		// Start returns once the exec has passed its point of no return;
		// the kernel has set the program's executable by then.
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			exe, _ := os.Readlink("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/exe")
			if strings.HasSuffix(exe, "/prog") || time.Now().After(deadline) {
				e.Expect("running from prog", strings.HasSuffix(exe, "/prog"), true)
				break
			}
		}
		for _, o := range []struct {
			name  string
			flags int
		}{{"O_WRONLY", unix.O_WRONLY}, {"O_RDWR", unix.O_RDWR}, {"O_RDONLY|O_TRUNC", unix.O_RDONLY | unix.O_TRUNC}, {"O_WRONLY|O_TRUNC", unix.O_WRONLY | unix.O_TRUNC}} {
			fd, err := unix.Open(e.P("prog"), o.flags|unix.O_CLOEXEC, 0)
			if err == nil {
				unix.Close(fd)
			}
			e.ExpectErrno("open "+o.name, err, "ETXTBSY")
		}
		e.ExpectErrno("truncate", unix.Truncate(e.P("prog"), 0), "ETXTBSY")
		st := e.MustStat("prog")
		e.Expect("size kept", st.Size, int64(len(prog)))
		e.Expect("still running", cmd.Process.Signal(syscall.Signal(0)), nil)
		got, err := os.ReadFile(e.P("prog"))
		e.Must(err, "read prog")
		e.Expect("content kept", string(got) == string(prog), true)
	}},
)
