// Package session is the 9P2000.L session of shale's client (remote): a
// connection with typed requests (p9wire's messages) in flight together,
// the fids it keeps for its owners, and the session that redials a lost
// connection and runs, in order, the steps a new connection needs before
// it serves.
//
// The client speaks 9P2000.L itself (codec: p9wire) rather than through
// hugelgupf/p9's Client: that one cannot do extended attributes (ENOSYS),
// sends Tlock without its fid, has no Tgetlock, puts no deadline on a
// request, and after a connection error its shared pool of replies can
// hand a stale answer to a request on another connection.
//
// Lock order: Session.mu, then Conn.mu; Conn.wmu is taken alone. No lock
// is held across a request.
package session

import (
	"errors"
	"sync/atomic"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// ErrLost fails the requests of a connection that broke or timed out;
// callers see EIO.
var ErrLost = errors.New("9p: connection lost")

var errTimeout = errors.New("9p: no reply within the timeout")

// errClosed ends a connection on purpose: nothing to warn about.
var errClosed = errors.New("closed")

// Counters are what a session's connections count: bytes both ways and
// requests by T-message type (the journal's blocking reads apart).
type Counters struct {
	Reqs       [256]atomic.Uint64
	Sent, Recv atomic.Uint64 // bytes, frames included
	// Piped are requests sent behind another without waiting for its
	// reply (Pipe): each a round trip saved.
	Piped atomic.Uint64
}

// Token is the identity of the file r describes: the server's inode
// number (QID path) and its generation when it reports one; servers that
// report none (gen 0 or not valid) get 1, so a token is never {ino, 0}.
func Token(r *p9wire.Rattr) layer.Token {
	gen := uint64(1)
	if r.Valid&p9wire.GetattrGen != 0 && r.Gen != 0 {
		gen = r.Gen
	}
	return layer.Token{Ino: r.Qid.Path, Gen: gen}
}

// Errno turns a request's error into an Errno: the server's errno as it
// sent it, or EIO when the connection failed.
func Errno(err error) layer.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
