package fuseview

import "sync"

// go-fuse calls OnForget when the kernel forgets an inode, but a request
// at work at that moment may give the same inode back to the kernel: a
// LOOKUP (or READDIRPLUS, or LINK) that found it among the inodes go-fuse
// knows just before the FORGET let it go registers it again just after
// (go-fuse's NodeOnForgetter leaves this to the file system). Had the
// inode let its layer node go, the kernel would then use a node whose
// file is closed: every open failing with EBADF, for as long as the
// kernel kept the inode (TestTorture/inotify: a listing after a rename,
// met by the FORGET that the watcher's duplicate invalidation caused).
// So an inode lets its node go only once the requests at work at its
// OnForget have ended, and only if go-fuse has not taken it back.

func (i *inode) OnForget() {
	n := i.forgets.Add(1)
	i.v.makers.after(func() {
		// A later OnForget decides, or go-fuse took the inode back.
		if i.forgets.Load() != n || !i.Forgotten() {
			return
		}
		i.v.cached.Remove(i.node().Token(), i)
		i.h.release()
	})
}

// makers are a view's requests at work that may hand the kernel an inode
// go-fuse already knows (rawFS).
type makers struct {
	mu      sync.Mutex
	next    uint64          // the number of the next request
	running map[uint64]bool // the requests at work, by number
	waiting []waiter        // by growing before
}

// A waiter runs fn once no request numbered below before is at work.
type waiter struct {
	before uint64
	fn     func()
}

// start marks a request at work until the returned function runs.
func (m *makers) start() func() {
	m.mu.Lock()
	n := m.next
	m.next++
	if m.running == nil {
		m.running = map[uint64]bool{}
	}
	m.running[n] = true
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		delete(m.running, n)
		ready := m.ready()
		m.mu.Unlock()
		for _, fn := range ready {
			fn()
		}
	}
}

// after runs fn once every request at work now has ended: at once if none
// is.
func (m *makers) after(fn func()) {
	m.mu.Lock()
	m.waiting = append(m.waiting, waiter{m.next, fn})
	ready := m.ready()
	m.mu.Unlock()
	for _, fn := range ready {
		fn()
	}
}

// ready takes out the waiters whose requests have all ended; m.mu is held.
func (m *makers) ready() []func() {
	oldest := m.next
	for n := range m.running {
		oldest = min(oldest, n)
	}
	k := 0
	for k < len(m.waiting) && m.waiting[k].before <= oldest {
		k++
	}
	var fns []func()
	for _, w := range m.waiting[:k] {
		fns = append(fns, w.fn)
	}
	m.waiting = append(m.waiting[:0], m.waiting[k:]...)
	return fns
}
