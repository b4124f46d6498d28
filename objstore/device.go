package objstore

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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

	path     string
	made     bool // openDevice created the file
	readOnly bool
}

// Ways to open a device.
const (
	openRW     = iota // an existing store, to own it
	openRO            // an existing store, read only
	openCreate        // a new file, or a block device to format
)

// openDevice opens path and locks it. With create, a regular file is
// created (it must not exist yet) and preallocated to size; a block device
// is used as it is, and size, if non-zero, may only shrink it. An owner
// (openRW, openCreate in openDeviceMode) takes an exclusive flock on it, a reader (openRO) a
// shared one, so one process owns a store at a time and no reader runs
// beside it; the kernel drops the lock when its holder dies.
func openDevice(path string, create bool, size int64) (*device, error) {
	if create {
		return openDeviceMode(path, openCreate, size)
	}
	return openDeviceMode(path, openRW, size)
}

// openDeviceMode is openDevice for any of the modes.
func openDeviceMode(path string, mode int, size int64) (*device, error) {
	create := mode == openCreate
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
	if mode == openRO {
		flags = os.O_RDONLY
	}
	made := create && (st == nil || st.Mode()&os.ModeDevice == 0)
	if made {
		flags |= os.O_CREATE | os.O_EXCL
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil, err
	}
	d := &device{f: f, path: path, made: made, readOnly: mode == openRO, block: st != nil && st.Mode()&os.ModeDevice != 0}
	how := unix.LOCK_EX
	if mode == openRO {
		how = unix.LOCK_SH
	}
	if err := lockFile(f, path, how); err != nil {
		d.abandon()
		return nil, err
	}
	if err := d.sizeUp(create, size); err != nil {
		d.abandon()
		return nil, err
	}
	if df, err := os.OpenFile(path, flags&^(os.O_CREATE|os.O_EXCL)|unix.O_DIRECT, 0); err == nil {
		d.direct = df
	}
	return d, nil
}

// abandon closes a device that failed to become a store, removing the file
// if openDevice created it (never a file or device that was there before).
// The file goes while its lock is held, so no one opens it half made.
func (d *device) abandon() {
	if d.made {
		os.Remove(d.path)
	}
	d.close()
}

// ErrInUse is what opening a store that another process (or another Store
// in this one) owns returns; the error is an *InUseError.
var ErrInUse = errors.New("store is in use")

// InUseError says who holds a store's lock.
type InUseError struct {
	Path string
	PID  int    // 0 if it could not be found
	Cmd  string // the holder's command line, if known
}

func (e *InUseError) Error() string {
	switch {
	case e.PID == 0:
		return fmt.Sprintf("store %s is in use by another process: stop it, or wait", e.Path)
	case e.Cmd == "":
		return fmt.Sprintf("store %s is in use by process %d: stop it, or wait", e.Path, e.PID)
	}
	return fmt.Sprintf("store %s is in use by process %d (%s): stop it, or wait", e.Path, e.PID, e.Cmd)
}

func (e *InUseError) Is(target error) bool { return target == ErrInUse }

// lockFile takes a flock on f without waiting. If another holds a lock
// that conflicts, the error names that process.
func lockFile(f *os.File, path string, how int) error {
	err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EWOULDBLOCK) {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	e := &InUseError{Path: path}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) == nil {
		e.PID = flockHolder(st.Dev, st.Ino, how == unix.LOCK_SH)
	}
	if e.PID != 0 {
		e.Cmd = cmdline(e.PID)
	}
	return e
}

// flockHolder finds in /proc/locks a process holding a flock on the file
// dev:ino that conflicts with ours: any lock for an exclusive request, a
// write lock for a shared one. It returns 0 if there is none it can see.
func flockHolder(dev, ino uint64, shared bool) int {
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return 0
	}
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(dev), unix.Minor(dev), ino)
	self := os.Getpid()
	other := 0
	for _, line := range strings.Split(string(b), "\n") {
		// "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; waiters have "->".
		fs := strings.Fields(line)
		if len(fs) < 6 || fs[1] != "FLOCK" || fs[5] != want {
			continue
		}
		if shared && fs[3] != "WRITE" {
			continue
		}
		pid, err := strconv.Atoi(fs[4])
		if err != nil || pid <= 0 {
			continue
		}
		if pid != self {
			return pid
		}
		other = pid // this process holds it through another Store
	}
	return other
}

// cmdline is a process's command line, shortened for an error message.
func cmdline(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
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
