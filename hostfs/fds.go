package hostfs

import (
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// Every node the kernel keeps in its caches is a node here, and a node is
// cheapest to use through an open O_PATH descriptor. But descriptors are
// bounded by RLIMIT_NOFILE, which a container may not let us raise, while
// the kernel may cache far more inodes. So descriptors are a cache: at most
// budget of them are open, and when more are needed, the least recently
// used node (clock algorithm) trades its descriptor for a file handle
// (name_to_handle_at) and reopens by handle (open_by_handle_at) when next
// used. Nodes whose file system has no handles keep their descriptors.

// fdCache is the set of nodes holding descriptors.
type fdCache struct {
	mu      sync.Mutex
	ring    []*node
	hand    int
	budget  int
	mountFd int  // an ordinary descriptor of the root, for open_by_handle_at
	handles bool // open_by_handle_at works here (it needs CAP_DAC_READ_SEARCH)
}

func newFdCache(mountFd int) *fdCache {
	// Half the descriptors for nodes; the rest for open files and
	// everything else.
	budget := 512
	var l unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &l) == nil {
		budget = int(max(min(l.Cur/2, 1<<20), 64))
	}
	c := &fdCache{budget: budget, mountFd: mountFd}
	if fh, _, err := unix.NameToHandleAt(mountFd, "", unix.AT_EMPTY_PATH); err == nil {
		if fd, err := unix.OpenByHandleAt(mountFd, fh, unix.O_PATH|unix.O_CLOEXEC); err == nil {
			unix.Close(fd)
			c.handles = true
		}
	}
	return c
}

// use returns the node's descriptor, reopening it if it was traded for a
// handle; done must follow.
func (n *node) use() (int, layer.Errno) {
	n.mu.Lock()
	if n.fd >= 0 {
		n.users++
		n.ref = true
		n.mu.Unlock()
		return n.fd, 0
	}
	if n.fh == nil {
		n.mu.Unlock()
		return -1, syscall.EBADF // forgotten
	}
	fd, err := unix.OpenByHandleAt(n.fs.fds.mountFd, *n.fh, unix.O_PATH|unix.O_CLOEXEC)
	if err != nil {
		n.mu.Unlock()
		return -1, errno(err)
	}
	n.fd = fd
	n.users++
	n.ref = true
	n.mu.Unlock()
	n.fs.fds.add(n)
	return fd, 0
}

func (n *node) done() {
	n.mu.Lock()
	n.users--
	n.mu.Unlock()
}

// add enters a node that just got a descriptor, and evicts others if the
// budget is exceeded.
func (c *fdCache) add(n *node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n.mu.Lock()
	gone := n.fd < 0 || n.slot >= 0 // forgotten meanwhile, or already in
	n.mu.Unlock()
	if gone {
		return
	}
	n.slot = len(c.ring)
	c.ring = append(c.ring, n)
	// Two sweeps clear every reference bit; nodes in use are skipped.
	for tries := 2 * len(c.ring); c.handles && len(c.ring) > c.budget && tries > 0; tries-- {
		c.hand %= len(c.ring)
		v := c.ring[c.hand]
		if v != n && v.mu.TryLock() {
			if v.ref || v.users > 0 || !v.evict() {
				v.ref = false
				v.mu.Unlock()
				c.hand++
				continue
			}
			v.mu.Unlock()
			c.remove(v)
			continue
		}
		c.hand++
	}
}

// remove takes n out of the ring; c.mu is held.
func (c *fdCache) remove(n *node) {
	if n.slot < 0 {
		return
	}
	last := c.ring[len(c.ring)-1]
	c.ring[n.slot] = last
	last.slot = n.slot
	c.ring = c.ring[:len(c.ring)-1]
	n.slot = -1
}

// evict trades the descriptor for a handle; n.mu is held.
func (n *node) evict() bool {
	if n.pinned || !n.fs.fds.handles {
		return false
	}
	if n.fh == nil {
		fh, _, err := unix.NameToHandleAt(n.fd, "", unix.AT_EMPTY_PATH)
		if err != nil || n.dev != n.fs.rootDev {
			n.pinned = true // no handles here: keep the descriptor
			return false
		}
		n.fh = &fh
	}
	unix.Close(n.fd)
	n.fd = -1
	return true
}

// forget closes the descriptor for good.
func (n *node) forget() {
	c := n.fs.fds
	c.mu.Lock()
	c.remove(n)
	c.mu.Unlock()
	n.mu.Lock()
	if n.fd >= 0 {
		unix.Close(n.fd)
	}
	n.fd = -1
	n.fh = nil
	n.mu.Unlock()
}
