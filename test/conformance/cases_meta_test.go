package conformance

import (
	"fmt"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tsNs is a timestamp in nanoseconds since the epoch.
func tsNs(ts unix.Timespec) int64 { return ts.Sec*1e9 + ts.Nsec }

// past is an old timestamp that no operation of a case can produce.
var past = unix.Timespec{Sec: 1_000_000_000, Nsec: 111_111_111}

// setPast sets atime and mtime of rel to past and returns the stat after.
func (e *env) setPast(rel string) unix.Stat_t {
	e.t.Helper()
	e.Must(unix.UtimesNanoAt(unix.AT_FDCWD, e.P(rel), []unix.Timespec{past, past}, unix.AT_SYMLINK_NOFOLLOW), "utimensat %s", rel)
	return e.MustStat(rel)
}

// tick waits long enough for the file system clock (coarse, one jiffy)
// to move on, so that a ctime change is visible.
func tick() { time.Sleep(15 * time.Millisecond) }

var _ = addCases(
	testCase{"times-utimensat", func(t *testing.T, e *env) {
		e.WriteFile("f", "x", 0o644)
		e.Must(os.Symlink("f", e.P("l")), "symlink")
		e.Mkdir("d", 0o755)
		for _, tc := range []struct {
			name         string
			atime, mtime unix.Timespec
		}{
			{"ns", unix.Timespec{Sec: 1_000_000_000, Nsec: 123_456_789}, unix.Timespec{Sec: 1_500_000_000, Nsec: 987_654_321}},
			{"epoch", unix.Timespec{Sec: 0, Nsec: 0}, unix.Timespec{Sec: 0, Nsec: 1}},
			{"pre-1970", unix.Timespec{Sec: -1_000_000, Nsec: 500}, unix.Timespec{Sec: -1, Nsec: 999_999_999}},
			{"2038+", unix.Timespec{Sec: 1 << 31, Nsec: 5}, unix.Timespec{Sec: 1<<33 - 1, Nsec: 6}},
		} {
			for _, rel := range []string{"f", "l", "d"} {
				err := unix.UtimesNanoAt(unix.AT_FDCWD, e.P(rel), []unix.Timespec{tc.atime, tc.mtime}, unix.AT_SYMLINK_NOFOLLOW)
				e.ExpectErrno(tc.name+" utimensat "+rel, err, "OK")
				st := e.MustStat(rel)
				e.Expect(tc.name+" atime "+rel, tsNs(st.Atim), tsNs(tc.atime))
				e.Expect(tc.name+" mtime "+rel, tsNs(st.Mtim), tsNs(tc.mtime))
			}
		}
		// UTIME_OMIT keeps a time; UTIME_NOW sets the current one.
		e.setPast("f")
		omit := unix.Timespec{Nsec: unix.UTIME_OMIT}
		now := unix.Timespec{Nsec: unix.UTIME_NOW}
		e.Must(unix.UtimesNanoAt(unix.AT_FDCWD, e.P("f"), []unix.Timespec{omit, {Sec: 2_000_000_000, Nsec: 42}}, 0), "utimensat")
		st := e.MustStat("f")
		e.Expect("omit atime", tsNs(st.Atim), tsNs(past))
		e.Expect("set mtime", tsNs(st.Mtim), int64(2_000_000_000_000_000_042))
		before := time.Now().Add(-time.Second).UnixNano()
		e.Must(unix.UtimesNanoAt(unix.AT_FDCWD, e.P("f"), []unix.Timespec{now, omit}, 0), "utimensat")
		st = e.MustStat("f")
		e.Expect("UTIME_NOW atime is now", tsNs(st.Atim) > before && tsNs(st.Atim) < time.Now().Add(time.Second).UnixNano(), true)
		e.Expect("UTIME_NOW keeps mtime", tsNs(st.Mtim), int64(2_000_000_000_000_000_042))
		// Through a descriptor, futimens.
		fd, err := unix.Open(e.P("f"), unix.O_RDONLY, 0)
		e.Must(err, "open")
		e.ExpectErrno("futimens", unix.UtimesNanoAt(fd, "", []unix.Timespec{past, past}, unix.AT_EMPTY_PATH), "OK")
		unix.Close(fd)
		st = e.MustStat("f")
		e.Expect("futimens mtime", tsNs(st.Mtim), tsNs(past))
		e.ExpectErrno("bad nsec", unix.UtimesNano(e.P("f"), []unix.Timespec{{Sec: 1, Nsec: 1e9}, past}), "EINVAL")
	}},

	testCase{"times-updates", func(t *testing.T, e *env) {
		e.WriteFile("f", "hello", 0o644)
		e.Mkdir("d", 0o755)

		// write: mtime and ctime change, atime does not.
		c0 := e.setPast("f").Ctim
		tick()
		fd, err := unix.Open(e.P("f"), unix.O_WRONLY, 0)
		e.Must(err, "open")
		_, err = unix.Pwrite(fd, []byte("J"), 0)
		e.Must(err, "pwrite")
		unix.Close(fd)
		st := e.MustStat("f")
		e.Expect("write: mtime changed", tsNs(st.Mtim) != tsNs(past), true)
		e.Expect("write: ctime advanced", tsNs(st.Ctim) > tsNs(c0), true)
		e.Expect("write: ctime >= mtime", tsNs(st.Ctim) >= tsNs(st.Mtim), true)
		e.Expect("write: atime kept", tsNs(st.Atim), tsNs(past))

		// chmod: ctime only.
		c0 = e.setPast("f").Ctim
		tick()
		e.Must(unix.Chmod(e.P("f"), 0o600), "chmod")
		st = e.MustStat("f")
		e.Expect("chmod: ctime advanced", tsNs(st.Ctim) > tsNs(c0), true)
		e.Expect("chmod: mtime kept", tsNs(st.Mtim), tsNs(past))
		e.Expect("chmod: atime kept", tsNs(st.Atim), tsNs(past))

		// chown: ctime only.
		c0 = e.setPast("f").Ctim
		tick()
		e.Must(unix.Chown(e.P("f"), 65534, 65534), "chown")
		st = e.MustStat("f")
		e.Expect("chown: ctime advanced", tsNs(st.Ctim) > tsNs(c0), true)
		e.Expect("chown: mtime kept", tsNs(st.Mtim), tsNs(past))

		// truncate: mtime and ctime.
		c0 = e.setPast("f").Ctim
		tick()
		e.Must(unix.Truncate(e.P("f"), 2), "truncate")
		st = e.MustStat("f")
		e.Expect("truncate: mtime changed", tsNs(st.Mtim) != tsNs(past), true)
		e.Expect("truncate: ctime advanced", tsNs(st.Ctim) > tsNs(c0), true)

		// rename: the file's ctime (ext4 does), the directory's mtime and ctime.
		c0 = e.setPast("f").Ctim
		dc0 := e.setPast("d").Ctim
		tick()
		e.Must(unix.Rename(e.P("f"), e.P("d/g")), "rename")
		st = e.MustStat("d/g")
		e.Expect("rename: file ctime advanced", tsNs(st.Ctim) > tsNs(c0), true)
		e.Expect("rename: file mtime kept", tsNs(st.Mtim), tsNs(past))
		dst := e.MustStat("d")
		e.Expect("rename: new parent mtime changed", tsNs(dst.Mtim) != tsNs(past), true)
		e.Expect("rename: new parent ctime advanced", tsNs(dst.Ctim) > tsNs(dc0), true)

		// link: the file's ctime; create and unlink: the directory's times.
		c0 = e.setPast("d/g").Ctim
		e.setPast("d")
		tick()
		e.Must(unix.Link(e.P("d/g"), e.P("d/h")), "link")
		e.Expect("link: file ctime advanced", tsNs(e.MustStat("d/g").Ctim) > tsNs(c0), true)
		e.Expect("link: dir mtime changed", tsNs(e.MustStat("d").Mtim) != tsNs(past), true)
		c0 = e.setPast("d/g").Ctim
		e.setPast("d")
		tick()
		e.Must(unix.Unlink(e.P("d/h")), "unlink")
		e.Expect("unlink: file ctime advanced", tsNs(e.MustStat("d/g").Ctim) > tsNs(c0), true)
		e.Expect("unlink: dir mtime changed", tsNs(e.MustStat("d").Mtim) != tsNs(past), true)
		e.setPast("d")
		e.Must(unix.Mkdir(e.P("d/sub"), 0o755), "mkdir")
		e.Expect("mkdir: dir mtime changed", tsNs(e.MustStat("d").Mtim) != tsNs(past), true)

		// setxattr: ctime only.
		c0 = e.setPast("d/g").Ctim
		tick()
		e.Must(unix.Setxattr(e.P("d/g"), "user.t", []byte("v"), 0), "setxattr")
		st = e.MustStat("d/g")
		e.Expect("setxattr: ctime advanced", tsNs(st.Ctim) > tsNs(c0), true)
		e.Expect("setxattr: mtime kept", tsNs(st.Mtim), tsNs(past))

		// A new file's times are now, and equal.
		fd, err = unix.Open(e.P("new"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
		e.Must(err, "create")
		unix.Close(fd)
		st = e.MustStat("new")
		e.Expect("new: mtime == ctime", tsNs(st.Mtim) == tsNs(st.Ctim), true)
		e.Expect("new: atime == mtime", tsNs(st.Atim) == tsNs(st.Mtim), true)
		e.Expect("new: recent", time.Since(time.Unix(0, tsNs(st.Mtim))) < time.Minute, true)
	}},

	// Under relatime a read updates atime when atime is not newer than
	// mtime (or older than a day), and leaves it otherwise.
	testCase{"times-atime-relatime", func(t *testing.T, e *env) {
		e.WriteFile("f", "hello", 0o644)
		mt := unix.Timespec{Sec: 1_500_000_000}
		at := unix.Timespec{Sec: 1_400_000_000}
		e.Must(unix.UtimesNano(e.P("f"), []unix.Timespec{at, mt}), "utimensat")
		_, err := os.ReadFile(e.P("f"))
		e.Must(err, "read")
		st := e.MustStat("f")
		e.Expect("read with atime < mtime: atime updated", tsNs(st.Atim) > tsNs(mt), true)
		// utimensat sets ctime to now: only an atime in the future is
		// newer than both mtime and ctime.
		future := unix.Timespec{Sec: time.Now().Unix() + 3600, Nsec: 7}
		e.Must(unix.UtimesNano(e.P("f"), []unix.Timespec{future, mt}), "utimensat")
		_, err = os.ReadFile(e.P("f"))
		e.Must(err, "read")
		e.Expect("read with atime > mtime, ctime: atime kept", tsNs(e.MustStat("f").Atim) == tsNs(future), true)
		// A directory listing is a read of the directory.
		e.Mkdir("d", 0o755)
		e.Must(unix.UtimesNano(e.P("d"), []unix.Timespec{at, mt}), "utimensat")
		_, err = os.ReadDir(e.P("d"))
		e.Must(err, "readdir")
		e.Expect("readdir with atime < mtime: atime updated", tsNs(e.MustStat("d").Atim) > tsNs(mt), true)
	}},

	testCase{"nlink", func(t *testing.T, e *env) {
		e.WriteFile("f", "x", 0o644)
		e.Expect("file", e.MustStat("f").Nlink, uint64(1))
		e.Must(unix.Link(e.P("f"), e.P("g")), "link")
		e.Expect("after link: f", e.MustStat("f").Nlink, uint64(2))
		e.Expect("after link: g", e.MustStat("g").Nlink, uint64(2))
		e.Must(unix.Link(e.P("g"), e.P("h")), "link")
		e.Expect("after 2nd link", e.MustStat("f").Nlink, uint64(3))
		e.ExpectErrno("link onto existing name", unix.Link(e.P("f"), e.P("h")), "EEXIST")
		e.Must(unix.Unlink(e.P("f")), "unlink")
		e.Expect("after unlink: g", e.MustStat("g").Nlink, uint64(2))
		e.Must(unix.Unlink(e.P("h")), "unlink")
		e.Expect("after unlink: g", e.MustStat("g").Nlink, uint64(1))
		e.ReadFile("content via g", "g")

		e.Mkdir("d", 0o755)
		e.ExpectErrno("link to a dir", unix.Link(e.P("d"), e.P("dl")), "EPERM")
		e.Expect("empty dir", e.MustStat("d").Nlink, uint64(2))
		parent := e.MustStat(".").Nlink
		e.Expect("case root", parent, uint64(3))
		for i := 0; i < 3; i++ {
			e.Must(unix.Mkdir(e.P(fmt.Sprintf("d/s%d", i)), 0o755), "mkdir")
		}
		e.Expect("dir with 3 subdirs", e.MustStat("d").Nlink, uint64(5))
		e.Must(os.WriteFile(e.P("d/file"), nil, 0o644), "create")
		e.Expect("a file does not count", e.MustStat("d").Nlink, uint64(5))
		e.Must(unix.Rmdir(e.P("d/s1")), "rmdir")
		e.Expect("after rmdir", e.MustStat("d").Nlink, uint64(4))
		e.Must(unix.Rename(e.P("d/s0"), e.P("s0")), "rename")
		e.Expect("after moving a subdir out: d", e.MustStat("d").Nlink, uint64(3))
		e.Expect("after moving a subdir out: root", e.MustStat(".").Nlink, uint64(4))
		e.Must(os.Symlink("d", e.P("sym")), "symlink")
		e.Expect("symlink", e.MustStat("sym").Nlink, uint64(1))
		e.Must(unix.Link(e.P("sym"), e.P("sym2")), "link a symlink")
		e.Expect("hard-linked symlink", e.MustStat("sym").Nlink, uint64(2))
		e.Tree("tree", ".")
	}},
)
