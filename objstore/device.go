package objstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// device is the file or block device under a store. Small objects go
// through the page cache (the CFS paper's lesson: buffering is what makes
// small writes fast); large ones bypass it with O_DIRECT to stream at the
// device's bandwidth. Linux keeps the two paths coherent on the same file.
type device struct {
	f      *os.File
	direct *os.File // nil where O_DIRECT is not supported (e.g. tmpfs)
	size   int64
	block  bool // a block device rather than a regular file
}

// openDevice opens path. With create, a regular file is created (it must not
// exist yet) and preallocated to size; a block device is used as it is, and
// size, if non-zero, may only shrink it.
func openDevice(path string, create bool, size int64) (*device, error) {
	st, err := os.Stat(path)
	switch {
	case err == nil && st.Mode()&os.ModeDevice != 0:
	case err == nil && create:
		return nil, fmt.Errorf("%s already exists: remove it or choose another path", path)
	case err == nil && !st.Mode().IsRegular():
		return nil, fmt.Errorf("%s is neither a regular file nor a block device", path)
	case errors.Is(err, os.ErrNotExist) && !create:
		return nil, fmt.Errorf("no object store at %s: create one with 'shale objstore create %s --size 1GiB'", path, path)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	flags := os.O_RDWR
	if create && (st == nil || st.Mode()&os.ModeDevice == 0) {
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, err
	}
	d := &device{f: f, block: st != nil && st.Mode()&os.ModeDevice != 0}
	if err := d.sizeUp(create, size); err != nil {
		f.Close()
		if create && !d.block {
			os.Remove(path)
		}
		return nil, err
	}
	if df, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0); err == nil {
		d.direct = df
	}
	return d, nil
}

func (d *device) sizeUp(create bool, size int64) error {
	end, err := d.f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	switch {
	case d.block && size > end:
		return fmt.Errorf("%s holds %d bytes, less than the %d asked for: leave out --size to use all of it", d.f.Name(), end, size)
	case d.block && size > 0:
		d.size = size
	case d.block || !create:
		d.size = end
	default:
		if err := unix.Fallocate(int(d.f.Fd()), 0, 0, size); err != nil {
			if !errors.Is(err, unix.EOPNOTSUPP) {
				return fmt.Errorf("preallocate %s: %w", d.f.Name(), err)
			}
			if err := d.f.Truncate(size); err != nil {
				return err
			}
		}
		d.size = size
	}
	return nil
}

func (d *device) close() error {
	if d.direct != nil {
		d.direct.Close()
	}
	return d.f.Close()
}

func (d *device) sync() error { return unix.Fdatasync(int(d.f.Fd())) }

// readAt reads len(p) bytes at off, directly when p is large and suitably
// aligned. Small reads stay buffered: O_DIRECT would make each one a device
// round trip and flush any dirty pages it overlaps.
func (d *device) readAt(p []byte, off int64) error {
	f := d.f
	if d.direct != nil && len(p) >= directMin && isAligned(p) && off%blockSize == 0 {
		f = d.direct
	}
	_, err := f.ReadAt(p, off)
	return err
}

// readChunk is the unit in which readAhead reads large objects.
const readChunk = 16 << 20

const readersInFlight = 2

// readAhead starts reading p at off and returns a function that waits until
// the first n bytes are in. Large reads go chunk by chunk on another
// goroutine, so the caller can verify one chunk while the next is read.
func (d *device) readAhead(p []byte, off int64) func(n int) error {
	if len(p) <= readChunk {
		err := d.readAt(p, off)
		return func(int) error { return err }
	}
	chunks := (len(p) + readChunk - 1) / readChunk
	done := make([]chan error, chunks)
	for i := range done {
		done[i] = make(chan error, 1)
	}
	for w := 0; w < readersInFlight; w++ {
		go func() {
			for i := w; i < chunks; i += readersInFlight {
				c := i * readChunk
				done[i] <- d.readAt(p[c:min(c+readChunk, len(p))], off+int64(c))
			}
		}()
	}
	got := 0
	return func(n int) error {
		for ; got*readChunk < n; got++ {
			if err := <-done[got]; err != nil {
				return err
			}
		}
		return nil
	}
}

// writev writes bufs back to back at off. It uses O_DIRECT for large
// writes whose buffers are all aligned in memory and in length.
func (d *device) writev(bufs [][]byte, off int64) error {
	fd := int(d.f.Fd())
	if d.direct != nil && off%blockSize == 0 && allAligned(bufs) && totalLen(bufs) >= directMin {
		fd = int(d.direct.Fd())
	}
	for len(bufs) > 0 {
		n, err := unix.Pwritev(fd, bufs[:min(len(bufs), 1024)], off)
		if err != nil {
			return err
		}
		off += int64(n)
		for n > 0 {
			if n < len(bufs[0]) {
				bufs[0] = bufs[0][n:]
				break
			}
			n -= len(bufs[0])
			bufs = bufs[1:]
		}
	}
	return nil
}

func isAligned(p []byte) bool {
	return len(p) > 0 && uintptr(unsafe.Pointer(&p[0]))%blockSize == 0 && len(p)%blockSize == 0
}

func totalLen(bufs [][]byte) int {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	return n
}

func allAligned(bufs [][]byte) bool {
	for _, b := range bufs {
		if !isAligned(b) {
			return false
		}
	}
	return true
}

// alignedBuf returns a zeroed n-byte slice whose start is block aligned, so
// it can be the target of a direct read or the source of a direct write.
func alignedBuf(n int) []byte {
	b := make([]byte, n+blockSize)
	off := int(-uintptr(unsafe.Pointer(&b[0])) & (blockSize - 1))
	return b[off : off+n : off+n]
}
