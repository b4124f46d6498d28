package hostfs

import (
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// drainer reads a watcher's descriptor (fanotify or inotify, opened
// non-blocking): on the watcher's goroutine as events come, and on the
// goroutine of whoever calls sync. The kernel queues an event before the
// call that made the change returns, so once sync returns, every change
// made in LOWER before it was called has been raised: the 9P server
// syncs before it answers an open (close-to-open for LOWER's programs,
// docs/network.md).
type drainer struct {
	f      *os.File
	handle func([]byte) // one read's events; runs under mu

	mu  sync.Mutex // one reader at a time, so events are raised in order
	buf []byte
}

func newDrainer(f *os.File, handle func([]byte)) *drainer {
	return &drainer{f: f, handle: handle, buf: make([]byte, 64<<10)}
}

// run reads until the descriptor is closed.
func (d *drainer) run() {
	rc, err := d.f.SyscallConn()
	if err != nil {
		return
	}
	rc.Read(func(fd uintptr) bool {
		d.drain(fd)
		return false // wait for more, until closed
	})
}

// sync raises what is queued now.
func (d *drainer) sync() {
	if rc, err := d.f.SyscallConn(); err == nil {
		rc.Control(d.drain)
	}
}

func (d *drainer) drain(fd uintptr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for {
		k, err := unix.Read(int(fd), d.buf)
		if err != nil || k <= 0 {
			return
		}
		d.handle(d.buf[:k])
	}
}
