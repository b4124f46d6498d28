package conformance

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func setlk(fd int, cmd int, typ int16, start, n int64) error {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: n}
	return unix.FcntlFlock(uintptr(fd), cmd, &lk)
}

func getlk(fd int, cmd int, typ int16, start, n int64) (unix.Flock_t, error) {
	lk := unix.Flock_t{Type: typ, Whence: 0, Start: start, Len: n}
	err := unix.FcntlFlock(uintptr(fd), cmd, &lk)
	return lk, err
}

// pids replaces process ids in helper output by names.
func pids(s string, names map[int]string) string {
	for pid, name := range names {
		s = strings.ReplaceAll(s, fmt.Sprintf("pid=%d ", pid), "pid="+name+" ")
	}
	return s
}

var _ = addCases(
	testCase{"locks-posix", func(t *testing.T, e *env) {
		e.WriteFile("f", strings.Repeat("l", 1000), 0o644)
		fd := e.Fd("f", unix.O_RDWR, 0)
		me := map[int]string{os.Getpid(): "TEST"}
		e.ExpectErrno("lock [0,10) w", setlk(fd, unix.F_SETLK, unix.F_WRLCK, 0, 10), "OK")
		e.ExpectErrno("lock [500,EOF) r", setlk(fd, unix.F_SETLK, unix.F_RDLCK, 500, 0), "OK")
		r := e.As(asRoot,
			[]string{"open", "f", e.P("f"), "rw"},
			[]string{"setlk", "f", "w", "0", "10"},
			[]string{"setlk", "f", "w", "5", "10"},
			[]string{"setlk", "f", "r", "9", "1"},
			[]string{"setlk", "f", "w", "10", "10"},
			[]string{"getlk", "f", "w", "0", "100"},
			[]string{"getlk", "f", "w", "10", "100"},
			[]string{"getlk", "f", "r", "600", "1"},
			[]string{"getlk", "f", "w", "600", "1"},
			[]string{"setlk", "f", "r", "700", "10"},
		)
		want := []string{"OK", "EAGAIN", "EAGAIN", "EAGAIN", "OK",
			"OK F_WRLCK pid=TEST start=0 len=10",
			"OK F_UNLCK pid=0 start=10 len=100",
			"OK F_UNLCK pid=0 start=600 len=1",
			"OK F_RDLCK pid=TEST start=500 len=0",
			"OK"}
		for i := range r {
			e.Expect(fmt.Sprintf("other process step %d", i), pids(r[i]+" ", me), want[i]+" ")
		}

		// The other process holds a lock and waits.
		l := e.Start(asRoot,
			[]string{"open", "f", e.P("f"), "rw"},
			[]string{"setlk", "f", "r", "100", "100"},
			[]string{"setlk", "f", "w", "300", "1"},
			[]string{"wait"},
		)
		e.Expect("helper lock r", l.Line(e), "OK")
		e.Expect("helper lock r", l.Line(e), "OK")
		e.Expect("helper lock w", l.Line(e), "OK")
		lk, err := getlk(fd, unix.F_GETLK, unix.F_WRLCK, 0, 1000)
		e.Must(err, "getlk")
		// [0,10) is ours; the first conflicting lock is the helper's.
		e.Expect("getlk sees helper's lock", fmt.Sprintf("%d pid-is-helper=%v %d %d", lk.Type, int(lk.Pid) == l.Pid(), lk.Start, lk.Len), fmt.Sprintf("%d pid-is-helper=true 100 100", unix.F_RDLCK))
		lk, err = getlk(fd, unix.F_GETLK, unix.F_RDLCK, 250, 100)
		e.Must(err, "getlk")
		e.Expect("getlk for read sees the write lock only", fmt.Sprintf("%d pid-is-helper=%v %d %d", lk.Type, int(lk.Pid) == l.Pid(), lk.Start, lk.Len), fmt.Sprintf("%d pid-is-helper=true 300 1", unix.F_WRLCK))
		e.ExpectErrno("share the read lock", setlk(fd, unix.F_SETLK, unix.F_RDLCK, 150, 10), "OK")
		e.ExpectErrno("write lock conflicts", setlk(fd, unix.F_SETLK, unix.F_WRLCK, 150, 10), "EAGAIN")
		l.Next()
		e.Expect("helper done waiting", l.Line(e), "OK")
		l.Wait(e)
		e.ExpectErrno("write lock after the holder exited", setlk(fd, unix.F_SETLK, unix.F_WRLCK, 100, 300), "OK")

		// Closing any descriptor of the file drops the process's locks.
		other := e.Fd("f", unix.O_RDONLY, 0)
		r = e.As(asRoot, []string{"open", "f", e.P("f"), "rw"}, []string{"setlk", "f", "w", "0", "5"})
		e.Expect("still locked", r[1], "EAGAIN")
		e.Must(unix.Close(other), "close")
		r = e.As(asRoot, []string{"open", "f", e.P("f"), "rw"}, []string{"setlk", "f", "w", "0", "1000"}, []string{"getlk", "f", "w", "0", "0"})
		e.Expect("released by closing another fd", r[1], "OK")
		e.Expect("nothing left", r[2], "OK F_UNLCK pid=0 start=0 len=0")

		// Blocking F_SETLKW on a free range; unlocking.
		e.ExpectErrno("F_SETLKW", setlk(fd, unix.F_SETLKW, unix.F_WRLCK, 0, 10), "OK")
		e.ExpectErrno("F_UNLCK", setlk(fd, unix.F_SETLK, unix.F_UNLCK, 0, 0), "OK")
		ro := e.Fd("f", unix.O_RDONLY, 0)
		e.ExpectErrno("write lock on O_RDONLY fd", setlk(ro, unix.F_SETLK, unix.F_WRLCK, 0, 1), "EBADF")
		e.ExpectErrno("negative range", setlk(fd, unix.F_SETLK, unix.F_WRLCK, -5, 1), "EINVAL")
	}},

	testCase{"locks-ofd", func(t *testing.T, e *env) {
		e.WriteFile("f", "ofd", 0o644)
		a := e.Fd("f", unix.O_RDWR, 0)
		b := e.Fd("f", unix.O_RDWR, 0)
		e.ExpectErrno("OFD lock a", setlk(a, unix.F_OFD_SETLK, unix.F_WRLCK, 0, 0), "OK")
		e.ExpectErrno("OFD lock b conflicts in one process", setlk(b, unix.F_OFD_SETLK, unix.F_WRLCK, 0, 0), "EAGAIN")
		lk, err := getlk(b, unix.F_OFD_GETLK, unix.F_WRLCK, 0, 0)
		e.ExpectErrno("OFD getlk", err, "OK")
		e.Expect("OFD getlk result", fmt.Sprint(lk.Type, " ", lk.Pid), fmt.Sprint(unix.F_WRLCK, " -1"))
		// Closing the only descriptor of a's open file drops its locks at
		// once (close returns after the release on the native side).
		e.Must(unix.Close(a), "close")
		e.ExpectErrno("OFD lock b after close of a", setlk(b, unix.F_OFD_SETLK, unix.F_WRLCK, 0, 0), "OK")
		// Not merely late: still there half a second later.
		time.Sleep(500 * time.Millisecond)
		e.ExpectErrno("OFD lock b 0.5s after close of a", setlk(b, unix.F_OFD_SETLK, unix.F_WRLCK, 0, 0), "OK")
		// F_GETLK reports an OFD lock with pid -1. The kernel's FUSE
		// client does not tell the server that a lock is an OFD lock, so
		// a FUSE server can only report the locker's pid.
		e.WriteFile("g", "g", 0o644)
		c := e.Fd("g", unix.O_RDWR, 0)
		e.Must(setlk(c, unix.F_OFD_SETLK, unix.F_WRLCK, 0, 0), "OFD lock")
		r := e.As(asRoot, []string{"open", "g", e.P("g"), "rw"}, []string{"getlk", "g", "w", "0", "0"})
		e.Known("other process sees an OFD lock", pids(r[1]+" ", map[int]string{os.Getpid(): "TEST"}), "OK F_WRLCK pid=-1 start=0 len=0 ", "OK F_WRLCK pid=TEST start=0 len=0 ")
	}},

	// EWOULDBLOCK is EAGAIN on Linux, and is named so.
	testCase{"locks-flock", func(t *testing.T, e *env) {
		e.WriteFile("f", "flock", 0o644)
		a := e.Fd("f", unix.O_RDONLY, 0)
		b := e.Fd("f", unix.O_RDONLY, 0)
		e.ExpectErrno("a LOCK_EX", unix.Flock(a, unix.LOCK_EX|unix.LOCK_NB), "OK")
		e.ExpectErrno("b LOCK_EX, same process", unix.Flock(b, unix.LOCK_EX|unix.LOCK_NB), "EAGAIN")
		e.ExpectErrno("b LOCK_SH, same process", unix.Flock(b, unix.LOCK_SH|unix.LOCK_NB), "EAGAIN")
		dup, err := unix.Dup(a)
		e.Must(err, "dup")
		e.ExpectErrno("dup of a LOCK_EX again", unix.Flock(dup, unix.LOCK_EX|unix.LOCK_NB), "OK")
		r := e.As(asRoot,
			[]string{"open", "f", e.P("f"), "r"},
			[]string{"flock", "f", "ex"},
			[]string{"flock", "f", "sh"},
		)
		e.Expect("other process", strings.Join(r, ","), "OK,EAGAIN,EAGAIN")
		// flock and POSIX locks are independent.
		w := e.Fd("f", unix.O_RDWR, 0)
		r = e.As(asRoot, []string{"open", "f", e.P("f"), "rw"}, []string{"setlk", "f", "w", "0", "0"})
		e.Expect("POSIX lock beside flock", r[1], "OK")
		_ = w
		// Closing one of two descriptors of the open file keeps the lock.
		e.Must(unix.Close(a), "close a")
		e.ExpectErrno("b while the dup holds it", unix.Flock(b, unix.LOCK_EX|unix.LOCK_NB), "EAGAIN")
		e.Must(unix.Close(dup), "close dup")
		// FUSE drops an open file's flock locks at RELEASE, which the
		// kernel sends after close(2) returns: allow it half a second.
		err = unix.Flock(b, unix.LOCK_SH|unix.LOCK_NB)
		for i := 0; err != nil && i < 50; i++ {
			time.Sleep(10 * time.Millisecond)
			err = unix.Flock(b, unix.LOCK_SH|unix.LOCK_NB)
		}
		e.ExpectErrno("b after the last close", err, "OK")
		// Shared locks share; upgrade conflicts with another sharer.
		l := e.Start(asRoot, []string{"open", "f", e.P("f"), "r"}, []string{"flock", "f", "sh"}, []string{"wait"}, []string{"flock", "f", "un"})
		e.Expect("helper open", l.Line(e), "OK")
		e.Expect("helper LOCK_SH beside ours", l.Line(e), "OK")
		e.ExpectErrno("upgrade to LOCK_EX", unix.Flock(b, unix.LOCK_EX|unix.LOCK_NB), "EAGAIN")
		l.Next()
		e.Expect("helper waited", l.Line(e), "OK")
		e.Expect("helper LOCK_UN", l.Line(e), "OK")
		e.ExpectErrno("upgrade after helper's unlock", unix.Flock(b, unix.LOCK_EX|unix.LOCK_NB), "OK")
		l.Wait(e)
		// Released when the holder exits.
		l = e.Start(asRoot, []string{"open", "g", e.P("f"), "r"}, []string{"wait"})
		l.Line(e)
		e.Must(unix.Flock(b, unix.LOCK_UN), "unlock")
		c := e.Fd("f", unix.O_RDONLY, 0)
		e.ExpectErrno("c LOCK_EX", unix.Flock(c, unix.LOCK_EX|unix.LOCK_NB), "OK")
		l.Next()
		l.Line(e)
		l.Wait(e)
		e.Must(unix.Close(c), "close")
		r = e.As(asRoot, []string{"open", "f", e.P("f"), "r"}, []string{"flock", "f", "ex"})
		e.Expect("after close", r[1], "OK")
	}},
)
