package conformance

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Fd opens rel with flags and closes it when the case ends.
func (e *env) Fd(rel string, flags int, mode uint32) int {
	e.t.Helper()
	fd, err := unix.Open(e.P(rel), flags|unix.O_CLOEXEC, mode)
	e.Must(err, "open %s", rel)
	e.t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// PreadAll reads n bytes at off from fd (fewer at EOF).
func (e *env) Pread(fd int, n int, off int64) []byte {
	e.t.Helper()
	buf := make([]byte, n)
	got := 0
	for got < n {
		k, err := unix.Pread(fd, buf[got:], off+int64(got))
		e.Must(err, "pread")
		if k == 0 {
			break
		}
		got += k
	}
	return buf[:got]
}

func allZero(b []byte) bool { return len(bytes.Trim(b, "\x00")) == 0 }

func seek(fd int, off int64, whence int) string {
	o, err := unix.Seek(fd, off, whence)
	if err != nil {
		return errName(err)
	}
	return fmt.Sprint(o)
}

const (
	giB  = int64(1) << 30
	kiB4 = 4096
)

var _ = addCases(
	testCase{"open-unlinked", func(t *testing.T, e *env) {
		fd := e.Fd("f", unix.O_RDWR|unix.O_CREAT|unix.O_EXCL, 0o640)
		_, err := unix.Write(fd, []byte("before"))
		e.Must(err, "write")
		e.ExpectErrno("unlink", unix.Unlink(e.P("f")), "OK")
		e.ExpectErrno("lstat after unlink", unix.Lstat(e.P("f"), new(unix.Stat_t)), "ENOENT")
		n, err := unix.Write(fd, []byte(" after"))
		e.ExpectErrno("write after unlink", err, "OK")
		e.Expect("written", n, 6)
		e.Expect("read after unlink", string(e.Pread(fd, 100, 0)), "before after")
		var st unix.Stat_t
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("fstat", statString(&st), "file 0640 uid=0 gid=0 nlink=0 size=12")
		e.ExpectErrno("fchmod", unix.Fchmod(fd, 0o600), "OK")
		e.ExpectErrno("ftruncate", unix.Ftruncate(fd, 5), "OK")
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("fstat after fchmod, ftruncate", statString(&st), "file 0600 uid=0 gid=0 nlink=0 size=5")
		e.ExpectErrno("fsetxattr", unix.Fsetxattr(fd, "user.u", []byte("v"), 0), "OK")
		// A new file may take the name meanwhile.
		e.WriteFile("f", "new", 0o644)
		e.Expect("old content", string(e.Pread(fd, 100, 0)), "befor")
		e.ReadFile("new file", "f")
		e.ExpectErrno("close", unix.Close(fd), "OK")
		// Also: a directory removed while open.
		e.Mkdir("d", 0o755)
		dfd := e.Fd("d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		e.Must(unix.Rmdir(e.P("d")), "rmdir")
		e.Must(unix.Fstat(dfd, &st), "fstat dir")
		e.Expect("removed dir nlink", st.Nlink, uint64(0))
		_, err = unix.Openat(dfd, "x", unix.O_CREAT|unix.O_WRONLY, 0o644)
		e.ExpectErrno("create in removed dir", err, "ENOENT")
		_, err = unix.Getdents(dfd, make([]byte, 4096))
		e.ExpectErrno("getdents on removed dir", err, "ENOENT")
		e.Tree("tree", ".")
	}},
	// A file written, closed, then opened only to read and unlinked: its
	// data stays readable through the open file (a caching client that
	// delayed the write must not drop it when the name goes).
	testCase{"open-unlinked-reader", func(t *testing.T, e *env) {
		e.WriteFile("f", "written", 0o644)
		e.WriteFile("g", "other", 0o644)
		fd := e.Fd("f", unix.O_RDONLY, 0)
		gd := e.Fd("g", unix.O_RDONLY, 0)
		e.ExpectErrno("unlink", unix.Unlink(e.P("f")), "OK")
		e.Expect("read after unlink", string(e.Pread(fd, 100, 0)), "written")
		e.ExpectErrno("rename over g", unix.Rename(e.P("g"), e.P("g2")), "OK")
		e.WriteFile("h", "new", 0o644)
		e.ExpectErrno("rename h over g2", unix.Rename(e.P("h"), e.P("g2")), "OK")
		e.Expect("read after replaced", string(e.Pread(gd, 100, 0)), "other")
		e.Tree("tree", ".")
	}},

	testCase{"sparse-5GiB", func(t *testing.T, e *env) {
		fd := e.Fd("f", unix.O_RDWR|unix.O_CREAT, 0o644)
		off := 5 * giB
		n, err := unix.Pwrite(fd, []byte("data"), off)
		e.ExpectErrno("pwrite at 5 GiB", err, "OK")
		e.Expect("written", n, 4)
		var st unix.Stat_t
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size", st.Size, off+4)
		e.Expect("few blocks", st.Blocks <= 64, true)
		e.Expect("SEEK_DATA 0", seek(fd, 0, unix.SEEK_DATA), fmt.Sprint(off))
		e.Expect("SEEK_HOLE 0", seek(fd, 0, unix.SEEK_HOLE), "0")
		e.Expect("SEEK_HOLE in data", seek(fd, off, unix.SEEK_HOLE), fmt.Sprint(off+4))
		e.Expect("SEEK_DATA past EOF", seek(fd, off+10, unix.SEEK_DATA), "ENXIO")
		e.Expect("SEEK_END", seek(fd, 0, unix.SEEK_END), fmt.Sprint(off+4))
		e.Expect("SEEK_SET past 4 GiB", seek(fd, 4*giB+1, unix.SEEK_SET), fmt.Sprint(4*giB+1))
		e.Expect("hole reads zeros", allZero(e.Pread(fd, 1<<20, 2*giB)), true)
		e.Expect("read across hole and data", fmt.Sprintf("%q", e.Pread(fd, 8, off-4)), `"\x00\x00\x00\x00data"`)
		e.Expect("read at EOF", len(e.Pread(fd, 8, off+4)), 0)
		// Read through the file position (not pread) past 4 GiB.
		_, err = unix.Seek(fd, off+1, unix.SEEK_SET)
		e.Must(err, "seek")
		buf := make([]byte, 10)
		n, err = unix.Read(fd, buf)
		e.Must(err, "read")
		e.Expect("read at position", string(buf[:n]), "ata")
		// Through the path, with stat.
		e.Stat("stat", "f")
		// Data at the 4 GiB boundary.
		_, err = unix.Pwrite(fd, []byte("XY"), 4*giB-1)
		e.Must(err, "pwrite")
		e.Expect("across 4 GiB", string(e.Pread(fd, 2, 4*giB-1)), "XY")
		e.ExpectErrno("ftruncate to 6 GiB", unix.Ftruncate(fd, 6*giB), "OK")
		e.Stat("stat after extend", "f")
		e.Expect("SEEK_DATA after last data", seek(fd, off+4096, unix.SEEK_DATA), "ENXIO")
		e.Expect("SEEK_HOLE after data", seek(fd, off, unix.SEEK_HOLE), fmt.Sprint(off+4096))
	}},

	testCase{"append-trunc", func(t *testing.T, e *env) {
		e.WriteFile("f", "start:", 0o644)
		a := e.Fd("f", unix.O_WRONLY|unix.O_APPEND, 0)
		b := e.Fd("f", unix.O_WRONLY|unix.O_APPEND, 0)
		for i := 0; i < 3; i++ {
			_, err := unix.Write(a, []byte(fmt.Sprintf("a%d,", i)))
			e.Must(err, "write a")
			_, err = unix.Write(b, []byte(fmt.Sprintf("b%d,", i)))
			e.Must(err, "write b")
		}
		// pwrite on an O_APPEND descriptor appends on Linux.
		_, err := unix.Pwrite(a, []byte("P"), 0)
		e.Must(err, "pwrite")
		e.Expect("interleaved appends", readString(e, "f"), "start:a0,b0,a1,b1,a2,b2,P")
		e.Expect("append fd offset (pwrite leaves it)", seek(a, 0, unix.SEEK_CUR), "21")
		// A plain writer at offset 0 overwrites; appenders still append.
		w := e.Fd("f", unix.O_WRONLY, 0)
		_, err = unix.Write(w, []byte("START"))
		e.Must(err, "write")
		_, err = unix.Write(b, []byte("!"))
		e.Must(err, "write")
		e.Expect("after overwrite", readString(e, "f"), "START:a0,b0,a1,b1,a2,b2,P!")
		// Another process appending (the helper, as root).
		e.NoteAs("helper append", asRoot, []string{"open", "f", e.P("f"), "a"}, []string{"close", "f"})

		// O_TRUNC empties the file and changes mtime.
		e.setPast("f")
		fd, err := unix.Open(e.P("f"), unix.O_WRONLY|unix.O_TRUNC, 0)
		e.Must(err, "open O_TRUNC")
		var st unix.Stat_t
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("O_TRUNC size", st.Size, int64(0))
		e.Expect("O_TRUNC mtime changed", tsNs(st.Mtim) != tsNs(past), true)
		// The appenders now append to the empty file.
		_, err = unix.Write(a, []byte("x"))
		e.Must(err, "write")
		e.Expect("append after trunc", readString(e, "f"), "x")
		unix.Close(fd)
		// O_TRUNC of an empty file leaves mtime (nothing to truncate)? On
		// ext4 it changes anyway; whatever native does, shale must do.
		e.WriteFile("g", "", 0o644)
		e.setPast("g")
		fd, err = unix.Open(e.P("g"), unix.O_WRONLY|unix.O_TRUNC, 0)
		e.Must(err, "open")
		unix.Close(fd)
		e.Note("O_TRUNC of empty file changes mtime", tsNs(e.MustStat("g").Mtim) != tsNs(past))
		// O_RDONLY|O_TRUNC truncates on Linux.
		e.WriteFile("h", "hhh", 0o644)
		fd, err = unix.Open(e.P("h"), unix.O_RDONLY|unix.O_TRUNC, 0)
		e.ExpectErrno("O_RDONLY|O_TRUNC", err, "OK")
		unix.Close(fd)
		e.Expect("O_RDONLY|O_TRUNC size", e.MustStat("h").Size, int64(0))
		// O_CREAT|O_EXCL on an existing file.
		_, err = unix.Open(e.P("h"), unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o644)
		e.ExpectErrno("O_EXCL existing", err, "EEXIST")
		_, err = unix.Open(e.P("."), unix.O_WRONLY, 0)
		e.ExpectErrno("open dir for writing", err, "EISDIR")
		_, err = unix.Open(e.P("h/x"), unix.O_RDONLY, 0)
		e.ExpectErrno("open under a file", err, "ENOTDIR")
		_, err = unix.Open(e.P("h"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
		e.ExpectErrno("O_DIRECTORY on a file", err, "ENOTDIR")
		e.Must(os.Symlink("h", e.P("l")), "symlink")
		_, err = unix.Open(e.P("l"), unix.O_RDONLY|unix.O_NOFOLLOW, 0)
		e.ExpectErrno("O_NOFOLLOW on a symlink", err, "ELOOP")
	}},

	testCase{"mmap-shared", func(t *testing.T, e *env) {
		const size = 3 * kiB4
		fd := e.Fd("f", unix.O_RDWR|unix.O_CREAT, 0o644)
		e.Must(unix.Ftruncate(fd, size), "ftruncate")
		m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		e.Must(err, "mmap")
		defer unix.Munmap(m)
		copy(m[100:], "through mmap")
		copy(m[kiB4+10:], "second page")
		e.ExpectErrno("msync", unix.Msync(m, unix.MS_SYNC), "OK")
		other := e.Fd("f", unix.O_RDONLY, 0)
		e.Expect("read() sees mmap write", string(e.Pread(other, 12, 100)), "through mmap")
		e.Expect("read() sees mmap write, page 2", string(e.Pread(other, 11, kiB4+10)), "second page")
		_, err = unix.Pwrite(fd, []byte("via write()"), 2*kiB4+5)
		e.Must(err, "pwrite")
		e.Expect("mmap sees write()", string(m[2*kiB4+5:2*kiB4+16]), "via write()")
		// A write through another descriptor of the same file.
		w := e.Fd("f", unix.O_WRONLY, 0)
		_, err = unix.Pwrite(w, []byte("other fd"), 50)
		e.Must(err, "pwrite")
		e.Expect("mmap sees write() via another fd", string(m[50:58]), "other fd")
		// A second, read-only mapping sees the first.
		m2, err := unix.Mmap(other, 0, size, unix.PROT_READ, unix.MAP_SHARED)
		e.Must(err, "mmap")
		defer unix.Munmap(m2)
		m[0] = 'Z'
		e.Expect("second mapping", string(m2[0]), "Z")
		e.Must(unix.Msync(m, unix.MS_SYNC), "msync")
		e.Must(unix.Munmap(m), "munmap")
		m = nil
		b, err := os.ReadFile(e.P("f"))
		e.Must(err, "read")
		e.Expect("file after munmap", strings.Trim(string(b[:120]), "\x00"), "Z"+strings.Repeat("\x00", 49)+"other fd"+strings.Repeat("\x00", 42)+"through mmap")
		var st unix.Stat_t
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size", st.Size, int64(size))
		// A private mapping does not write back.
		p, err := unix.Mmap(fd, 0, kiB4, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		e.Must(err, "mmap private")
		p[0] = 'p'
		unix.Munmap(p)
		e.Expect("private mapping not written", string(e.Pread(other, 1, 0)), "Z")
		_, err = unix.Mmap(other, 0, kiB4, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		e.ExpectErrno("shared writable map of O_RDONLY fd", err, "EACCES")
	}},

	testCase{"truncate", func(t *testing.T, e *env) {
		e.WriteFile("f", "hello world", 0o644)
		e.ExpectErrno("shrink", unix.Truncate(e.P("f"), 5), "OK")
		e.Expect("after shrink", readString(e, "f"), "hello")
		e.ExpectErrno("extend", unix.Truncate(e.P("f"), 10), "OK")
		e.Expect("after extend", readString(e, "f"), "hello\x00\x00\x00\x00\x00")
		fd := e.Fd("f", unix.O_RDWR, 0)
		e.ExpectErrno("ftruncate", unix.Ftruncate(fd, 3), "OK")
		e.Expect("after ftruncate", readString(e, "f"), "hel")
		// Shrinking then extending must not bring old bytes back.
		e.WriteFile("g", strings.Repeat("x", 10000), 0o644)
		e.Must(unix.Truncate(e.P("g"), 10), "truncate")
		e.Must(unix.Truncate(e.P("g"), 10000), "truncate")
		b, err := os.ReadFile(e.P("g"))
		e.Must(err, "read")
		e.Expect("shrink+extend", string(b[:10])+fmt.Sprint(allZero(b[10:]), " ", len(b)), "xxxxxxxxxxtrue 10000")
		e.ExpectErrno("truncate dir", unix.Truncate(e.P("."), 0), "EISDIR")
		e.ExpectErrno("truncate negative", unix.Truncate(e.P("f"), -1), "EINVAL")
		ro := e.Fd("f", unix.O_RDONLY, 0)
		e.ExpectErrno("ftruncate O_RDONLY fd", unix.Ftruncate(ro, 0), "EINVAL")
		e.ExpectErrno("truncate missing", unix.Truncate(e.P("nope"), 0), "ENOENT")
		e.ExpectErrno("truncate huge", unix.Truncate(e.P("f"), 1<<62), "EFBIG")
		r := e.Nobody([]string{"truncate", e.P("f"), "0"})
		e.Expect("nobody truncates root's 0644 file", r[0], "EACCES")
		e.Stat("stat", "f")
	}},

	testCase{"fallocate", func(t *testing.T, e *env) {
		fd := e.Fd("f", unix.O_RDWR|unix.O_CREAT, 0o644)
		e.ExpectErrno("allocate 8 KiB", unix.Fallocate(fd, 0, 0, 2*kiB4), "OK")
		var st unix.Stat_t
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size", st.Size, int64(2*kiB4))
		e.Expect("blocks", st.Blocks, int64(16))
		e.ExpectErrno("KEEP_SIZE beyond EOF", unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 2*kiB4, 2*kiB4), "OK")
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size kept", st.Size, int64(2*kiB4))
		e.Expect("blocks grew", st.Blocks, int64(32))
		_, err := unix.Pwrite(fd, bytes.Repeat([]byte("x"), 3*kiB4), 0)
		e.Must(err, "pwrite")
		e.ExpectErrno("PUNCH_HOLE|KEEP_SIZE", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, kiB4, kiB4), "OK")
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size after punch", st.Size, int64(3*kiB4))
		e.Expect("blocks after punch", st.Blocks, int64(24))
		b := e.Pread(fd, 3*kiB4, 0)
		e.Expect("punched range is zeros", allZero(b[kiB4:2*kiB4]), true)
		e.Expect("around the hole", string(b[kiB4-1])+string(b[2*kiB4]), "xx")
		e.Expect("SEEK_HOLE", seek(fd, 0, unix.SEEK_HOLE), fmt.Sprint(kiB4))
		e.Expect("SEEK_DATA after hole", seek(fd, kiB4, unix.SEEK_DATA), fmt.Sprint(2*kiB4))
		e.ExpectErrno("PUNCH_HOLE without KEEP_SIZE", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE, 0, kiB4), "ENOTSUP")
		e.ExpectErrno("ZERO_RANGE", unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE, 0, 10), "OK")
		e.Expect("after ZERO_RANGE", fmt.Sprintf("%q", e.Pread(fd, 11, 0)), `"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00x"`)
		// The kernel's FUSE client refuses every mode but KEEP_SIZE,
		// PUNCH_HOLE and ZERO_RANGE before asking the file system
		// (fs/fuse/file.c, fuse_file_fallocate): not shale's to fix.
		e.Known("COLLAPSE_RANGE", errName(unix.Fallocate(fd, unix.FALLOC_FL_COLLAPSE_RANGE, 0, kiB4)), "OK", "ENOTSUP")
		e.Known("INSERT_RANGE", errName(unix.Fallocate(fd, unix.FALLOC_FL_INSERT_RANGE, 0, kiB4)), "OK", "ENOTSUP")
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size after collapse and insert", st.Size, int64(3*kiB4))
		e.ExpectErrno("zero length", unix.Fallocate(fd, 0, 0, 0), "EINVAL")
		ro := e.Fd("f", unix.O_RDONLY, 0)
		e.ExpectErrno("O_RDONLY fd", unix.Fallocate(ro, 0, 0, kiB4), "EBADF")
		e.Expect("extend to 5 GiB", errName(unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 5*giB, kiB4)), "OK")
		e.Must(unix.Fstat(fd, &st), "fstat")
		e.Expect("size after allocating past 4 GiB with KEEP_SIZE", st.Size, int64(3*kiB4))
	}},

	testCase{"copy-file-range", func(t *testing.T, e *env) {
		src := make([]byte, 10000)
		for i := range src {
			src[i] = byte('a' + i%26)
		}
		e.Must(os.WriteFile(e.P("src"), src, 0o644), "write")
		in := e.Fd("src", unix.O_RDONLY, 0)
		out := e.Fd("dst", unix.O_RDWR|unix.O_CREAT, 0o644)
		offIn, offOut := int64(100), int64(50)
		n, err := unix.CopyFileRange(in, &offIn, out, &offOut, 5000, 0)
		e.ExpectErrno("copy_file_range", err, "OK")
		e.Expect("copied", n, 5000)
		e.Expect("offsets advanced", fmt.Sprint(offIn, offOut), "5100 5050")
		b := e.Pread(out, 20000, 0)
		e.Expect("dst", len(b) == 5050 && allZero(b[:50]) && bytes.Equal(b[50:], src[100:5100]), true)
		// With the file positions.
		_, err = unix.Seek(in, 9000, unix.SEEK_SET)
		e.Must(err, "seek")
		n, err = unix.CopyFileRange(in, nil, out, nil, 5000, 0)
		e.ExpectErrno("copy_file_range at positions", err, "OK")
		e.Expect("copied to EOF of src", n, 1000)
		e.Expect("src position", seek(in, 0, unix.SEEK_CUR), "10000")
		e.Expect("dst position", seek(out, 0, unix.SEEK_CUR), "1000")
		offIn = 20000
		n, err = unix.CopyFileRange(in, &offIn, out, nil, 10, 0)
		e.Expect("past EOF", fmt.Sprintf("%d %s", n, errName(err)), "0 OK")
		// Same file, overlapping ranges.
		offIn, offOut = 0, 10
		_, err = unix.CopyFileRange(out, &offIn, out, &offOut, 100, 0)
		e.ExpectErrno("overlapping", err, "EINVAL")
		offIn, offOut = 0, 0
		_, err = unix.CopyFileRange(in, &offIn, out, &offOut, 10, 1)
		e.ExpectErrno("bad flags", err, "EINVAL")
		_, err = unix.CopyFileRange(out, &offIn, in, &offOut, 10, 0)
		e.ExpectErrno("into O_RDONLY fd", err, "EBADF")
		// Across 4 GiB.
		offIn, offOut = 0, 5*giB
		n, err = unix.CopyFileRange(in, &offIn, out, &offOut, 26, 0)
		e.Expect("to 5 GiB", fmt.Sprintf("%d %s", n, errName(err)), "26 OK")
		e.Expect("data at 5 GiB", string(e.Pread(out, 30, 5*giB)), "abcdefghijklmnopqrstuvwxyz")
		e.Stat("dst", "dst")
	}},
)

func readString(e *env, rel string) string {
	e.t.Helper()
	b, err := os.ReadFile(e.P(rel))
	e.Must(err, "read %s", rel)
	return string(b)
}
