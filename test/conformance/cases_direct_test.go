package conformance

import (
	"bytes"
	"testing"

	"golang.org/x/sys/unix"
)

// alignedBuf is n bytes at a page boundary, as O_DIRECT wants its buffers.
func (e *env) alignedBuf(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	e.Must(err, "mmap")
	e.t.Cleanup(func() { unix.Munmap(b) })
	return b
}

var _ = addCases(
	// Direct I/O (fio --direct=1, databases): aligned writes and reads
	// through O_DIRECT, also past a hole. A layer that stores data in its
	// own blocks must not pass O_DIRECT down: its lower I/O is unaligned.
	testCase{"odirect", func(t *testing.T, e *env) {
		fd, err := unix.Open(e.P("f"), unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
		e.ExpectErrno("open O_DIRECT", err, "OK")
		if err != nil {
			return
		}
		t.Cleanup(func() { unix.Close(fd) })
		w := e.alignedBuf(2 * kiB4)
		for i := range w {
			w[i] = byte(i%251 + 1)
		}
		n, err := unix.Pwrite(fd, w, kiB4)
		e.ExpectErrno("write 8 KiB at 4 KiB", err, "OK")
		e.Expect("written", n, 2*kiB4)
		r := e.alignedBuf(4 * kiB4)
		n, err = unix.Pread(fd, r, 0)
		e.ExpectErrno("read from 0", err, "OK")
		e.Expect("read", n, 3*kiB4)
		e.Expect("hole reads zeros", allZero(r[:kiB4]), true)
		e.Expect("data reads back", bytes.Equal(r[kiB4:3*kiB4], w), true)
		n, err = unix.Pwrite(fd, w[:kiB4], 0)
		e.ExpectErrno("overwrite the hole", err, "OK")
		e.Expect("written over the hole", n, kiB4)
		e.Must(unix.Fsync(fd), "fsync")
		e.Stat("after", "f")
		e.Note("content", readString(e, "f")[:8])
	}},
)
