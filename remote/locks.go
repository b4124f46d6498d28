package remote

import (
	"context"
	"errors"
	"math"
	"syscall"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
	"github.com/shalefs/shale/remote/session"
	"golang.org/x/sys/unix"
)

// wireLock maps a lock to Tlock's type, start and length (0: to the end).
func wireLock(lk *layer.Lock) (uint8, uint64, uint64) {
	typ := uint8(p9wire.LockUnlock)
	switch lk.Type {
	case syscall.F_RDLCK:
		typ = p9wire.LockRead
	case syscall.F_WRLCK:
		typ = p9wire.LockWrite
	}
	if lk.Flock {
		return typ, 0, 0
	}
	var length uint64
	if lk.End != math.MaxUint64 && lk.End <= math.MaxInt64 {
		length = lk.End - lk.Start + 1
	}
	return typ, lk.Start, length
}

// lostLocks reports, once, that the handle's locks went with a lost
// connection: the caller's lock call fails with EIO rather than let a
// process that thinks it holds a lock go on without it unawares.
func (h *handle) lostLocks() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	lost := h.locksLost
	h.locksLost = false
	return lost
}

// Setlk takes the lock on the server, under this client's id and a
// proc_id for owner, so it conflicts with other clients' locks. The server
// is never asked to block (a blocked request would hold a server thread
// and our request past its timeout): with wait, Tlock is retried with
// backoff until it is granted or ctx ends (EINTR).
//
// Locks are the server's and do not survive a lost connection: the first
// lock call on a handle that held locks then fails with EIO, after which
// the handle starts afresh with none.
func (h *handle) Setlk(ctx context.Context, owner uint64, lk *layer.Lock, wait bool) layer.Errno {
	if e, done := h.setKept(ctx, owner, lk); done {
		return e
	}
	defer h.serverDone()
	typ, start, length := wireLock(lk)
	proc := h.fs.procRef(owner)
	defer h.fs.procUnref(owner)
	// A handle never opened on the server (a delegated open) holds no
	// locks there to have lost: its first Tlock goes with its open.
	var ride *session.Ride
	var first p9wire.LockReply
	if !h.everOpened() {
		ride = &session.Ride{Make: func(_ *session.Conn, fid uint32) (p9wire.Message, p9wire.Message) {
			return &p9wire.Lock{Fid: fid, LockType: typ, Start: start, Length: length, ProcID: proc, ClientID: h.fs.clientID}, &first
		}}
	}
	c, fid, _, e := h.useRiding(ctx, ride)
	if e != 0 {
		return e
	}
	if h.lostLocks() {
		return syscall.EIO
	}
	delay := 10 * time.Millisecond
	for {
		var st uint8
		var err error
		if ride != nil && ride.Sent {
			st, err = first.Status, ride.Err
		} else {
			st, err = c.Lock(fid, typ, start, length, proc, h.fs.clientID)
		}
		ride = nil
		if err != nil {
			return session.Errno(err)
		}
		switch st {
		case p9wire.LockSuccess:
			h.took(owner, lk.Flock, typ, start, length)
			return 0
		case p9wire.LockBlocked, p9wire.LockGrace:
			if !wait {
				return syscall.EAGAIN
			}
		default:
			return syscall.ENOLCK
		}
		select {
		case <-ctx.Done():
			return syscall.EINTR
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
		if c, fid, _, e = h.use(ctx); e != 0 {
			return e
		}
		if h.lostLocks() {
			return syscall.EIO
		}
	}
}

// took records that owner's Tlock (typ over start and length) was
// granted: the handle's owners, and what keeps the owner's proc_id.
func (h *handle) took(owner uint64, flock bool, typ uint8, start, length uint64) {
	o := lockOwner{owner, flock}
	h.mu.Lock()
	had := h.owners[o]
	if typ != p9wire.LockUnlock {
		h.addOwnerLocked(o)
	} else if flock || start == 0 && length == 0 {
		h.delOwnerLocked(o)
	}
	h.mu.Unlock()
	switch {
	case flock && typ != p9wire.LockUnlock && !had:
		h.fs.procRef(owner) // the handle's flock hold
	case flock && typ == p9wire.LockUnlock && had:
		h.fs.procUnref(owner)
	case !flock && typ != p9wire.LockUnlock:
		h.holdPosix(owner)
	case !flock && start == 0 && length == 0:
		// An unlock of the whole file: the owner holds none there.
		if _, held := h.takePosix(owner); held {
			h.fs.procUnref(owner)
		}
	}
}

// addOwnerLocked, delOwnerLocked and takeOwnersLocked change h.owners,
// and the count of the file's owners with locks on the server with it
// (keptlocks.go).
func (h *handle) addOwnerLocked(o lockOwner) {
	if h.owners[o] {
		return
	}
	if h.owners == nil {
		h.owners = map[lockOwner]bool{}
	}
	h.owners[o] = true
	h.fs.kept.ownersChanged(h.n.tok, 1)
}

func (h *handle) delOwnerLocked(o lockOwner) {
	if h.owners[o] {
		delete(h.owners, o)
		h.fs.kept.ownersChanged(h.n.tok, -1)
	}
}

func (h *handle) takeOwnersLocked() map[lockOwner]bool {
	owners := h.owners
	h.owners = nil
	if len(owners) > 0 {
		h.fs.kept.ownersChanged(h.n.tok, -len(owners))
	}
	return owners
}

// probeOwner takes the probe locks of Getlk; no kernel lock owner is it.
const probeOwner = math.MaxUint64

// Getlk asks the server with Tgetlock. Servers without it (hugelgupf/p9's,
// which shale serve is built on, answers an error) are probed instead:
// Tlock under a probe owner on a fid opened for the purpose, undone at
// once when granted. The probe has two flaws: while it holds its lock,
// another client's request can be refused; and it cannot tell the
// caller's own locks from others', so a lock the owner itself holds over
// the range is reported as a conflict (F_GETLK ignores one's own). A
// conflict is reported as a write lock over the asked range with no pid,
// as the server does not say whose lock it is.
func (h *handle) Getlk(ctx context.Context, owner uint64, lk *layer.Lock) layer.Errno {
	if e, done := h.getKept(ctx, owner, lk); done {
		return e
	}
	c, fid, _, e := h.use(ctx)
	if e != 0 {
		return e
	}
	if h.lostLocks() {
		return syscall.EIO
	}
	typ, start, length := wireLock(lk)
	if typ == p9wire.LockUnlock {
		return syscall.EINVAL
	}
	if !h.fs.noGetlock.Load() {
		r := p9wire.Getlock{R: true}
		err := c.RPC(&p9wire.Getlock{Fid: fid, LockType: typ, Start: start, Length: length, ProcID: h.fs.procRef(owner), ClientID: h.fs.clientID}, &r)
		h.fs.procUnref(owner)
		if err == nil {
			rtyp, rstart, rlen := r.LockType, r.Start, r.Length
			if rtyp == p9wire.LockUnlock {
				lk.Type = syscall.F_UNLCK
				return 0
			}
			lk.Type = syscall.F_WRLCK
			if rtyp == p9wire.LockRead {
				lk.Type = syscall.F_RDLCK
			}
			lk.Start, lk.End = rstart, math.MaxUint64
			if rlen != 0 {
				lk.End = rstart + rlen - 1
			}
			lk.Pid = 0 // the holder's proc_id is another client's numbering
			return 0
		}
		if errors.Is(err, session.ErrLost) {
			return syscall.EIO
		}
		h.fs.noGetlock.Store(true)
		h.fs.log.Debug("9p server has no Tgetlock: probing with Tlock", "err", err)
	}
	pfid, _, _, e := h.n.openFid(c, h.who, h.flags&unix.O_ACCMODE, nil)
	if e != 0 {
		return e
	}
	defer c.Clunk(pfid)
	proc := h.fs.procRef(probeOwner)
	defer h.fs.procUnref(probeOwner)
	st, err := c.Lock(pfid, typ, start, length, proc, h.fs.clientID)
	if err != nil {
		return session.Errno(err)
	}
	switch st {
	case p9wire.LockSuccess:
		c.Lock(pfid, p9wire.LockUnlock, start, length, proc, h.fs.clientID)
		lk.Type = syscall.F_UNLCK
	case p9wire.LockBlocked, p9wire.LockGrace:
		lk.Type = syscall.F_WRLCK
		lk.Pid = 0
	default:
		return syscall.ENOLCK
	}
	return 0
}
