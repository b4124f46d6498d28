package netdelay

import (
	"errors"
	"io"
	"net"
	"os"
	"time"
)

// Faults act on every connection, current and future, until changed: a
// caching network file system's tests need its link to fail the ways real
// ones do, on cue.

// mode is what the link does with the bytes that cross it.
type mode int

const (
	normal      mode = iota
	partitioned      // dropped, and new connections go nowhere
	stalled          // held in the queues
)

var modeNames = [...]string{normal: "normal", partitioned: "partitioned", stalled: "stalled"}

// Reset ends every current connection abruptly on both sides, as a
// crashed router or peer would: each end gets a reset (RST), not an EOF.
// It leaves the mode as it was: later connections are relayed as usual,
// or hang if the link is partitioned.
func (p *Proxy) Reset() {
	for _, r := range p.relays() {
		r.reset()
	}
}

// Partition cuts the link as a pulled cable would. Connections stay open
// but every byte the relay reads, either way, is dropped; new ones are
// accepted, so that clients see a hang rather than a refusal, but the
// target is not dialed and what they send is dropped too. Bytes still in
// the kernel's buffers at Heal may cross then, as TCP would resend them
// once the cable is back.
func (p *Proxy) Partition() { p.set(partitioned) }

// Stall freezes the link: bytes wait in the relay's queues, in order, and
// when those are full the senders are pushed back. Connections are still
// made, but what crosses them waits.
func (p *Proxy) Stall() { p.set(stalled) }

// Heal ends a Partition or a Stall. What a stall held back is delivered.
// After a partition, a connection that lost bytes is reset, its streams
// being garbage now; one that lost none (it was idle, or was accepted
// during the partition and sent nothing) goes on.
func (p *Proxy) Heal() { p.set(normal) }

// State is the link's fault: "normal", "partitioned" or "stalled".
func (p *Proxy) State() string {
	p.fmu.RLock()
	defer p.fmu.RUnlock()
	return modeNames[p.mode]
}

// set changes the mode and wakes whatever waits on it.
func (p *Proxy) set(m mode) {
	p.fmu.Lock()
	if p.mode == m {
		p.fmu.Unlock()
		return
	}
	was := p.mode
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	var lost []*relay
	if was == partitioned {
		for _, r := range p.relays() {
			if r.lost.Load() {
				lost = append(lost, r)
			} else if r.hanging {
				// Its Read ends now; with no partition it dials.
				r.client.SetReadDeadline(time.Now())
			}
		}
	}
	p.fmu.Unlock()
	// Resetting outside the lock lets no byte cross after the gap: a
	// relay that lost bytes drops everything from then on (drop, pass).
	for _, r := range lost {
		r.reset()
	}
}

// drop tells the reader whether the bytes it just read go nowhere: the
// link is cut, or was, and this connection waits to be reset. Marking the
// relay lost under the same lock as set reads it is what lets Heal find
// every connection a partition damaged.
func (r *relay) drop() bool {
	r.p.fmu.RLock()
	defer r.p.fmu.RUnlock()
	if r.p.mode == partitioned {
		r.lost.Store(true)
	}
	return r.lost.Load()
}

// pass tells the writer whether a chunk (or the EOF) that is due may be
// delivered, waiting while the link is stalled; false: drop it, or the
// relay is stopped.
func (r *relay) pass() bool {
	for {
		r.p.fmu.RLock()
		m, changed := r.p.mode, r.p.changed
		if m == partitioned {
			r.lost.Store(true)
		}
		lost := r.lost.Load()
		r.p.fmu.RUnlock()
		if lost {
			return false
		}
		if m != stalled {
			return true
		}
		select {
		case <-changed:
		case <-r.done:
			return false
		}
	}
}

// hang holds a connection accepted during a partition until it ends:
// nothing is dialed and what the client sends is read and dropped, as
// the cable would. True: the partition is over and the client sent
// nothing, so the relay goes on as usual; false: the relay ended (reset,
// if the client's bytes were lost).
func (r *relay) hang(fc *frameCounter) bool {
	b := bufPool.Get().(*[]byte)
	defer bufPool.Put(b)
	eof := false
	for {
		r.p.fmu.RLock()
		cut, changed := r.p.mode == partitioned, r.p.changed
		if r.hanging {
			// set may have woken us with a deadline: spend it.
			r.client.SetReadDeadline(time.Time{})
		}
		r.hanging = cut && !eof
		r.p.fmu.RUnlock()
		if !cut {
			if r.lost.Load() {
				r.reset()
				return false
			}
			return true
		}
		if eof {
			// The client's FIN is lost too: nothing to read, and
			// the relay is reset when the partition ends.
			select {
			case <-changed:
				continue
			case <-r.done:
				return false
			}
		}
		n, err := r.client.Read(*b)
		if n > 0 {
			fc.feed((*b)[:n])
			r.lost.Store(true)
		}
		switch {
		case err == nil || errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, io.EOF):
			eof = true
			r.lost.Store(true)
		default:
			return false // closed, or the client reset it
		}
	}
}

// reset ends the relay abruptly: with no linger, closing a socket sends
// a RST rather than a FIN.
func (r *relay) reset() {
	r.aborted.Store(true)
	linger0(r.client)
	r.mu.Lock()
	if r.server != nil {
		linger0(r.server)
	}
	r.mu.Unlock()
	r.stop()
}

func linger0(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0) // fails only if c is closed already
	}
}
