package remote

import (
	"errors"
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/p9wire"
)

// The client speaks 9P2000.L itself (codec: p9wire) rather than through
// hugelgupf/p9's Client: that one cannot do extended attributes (ENOSYS),
// sends Tlock without its fid, has no Tgetlock, puts no deadline on a
// request, and after a connection error its shared pool of replies can
// hand a stale answer to a request on another connection.

// token is the identity of the file r describes: the server's inode
// number (QID path) and its generation when it reports one; servers that
// report none (gen 0 or not valid) get 1, so a token is never {ino, 0}.
func token(r *p9wire.Rattr) layer.Token {
	gen := uint64(1)
	if r.Valid&p9wire.GetattrGen != 0 && r.Gen != 0 {
		gen = r.Gen
	}
	return layer.Token{Ino: r.Qid.Path, Gen: gen}
}

// errno turns a request's error into an Errno: the server's errno as it
// sent it, or EIO when the connection failed.
func errno(err error) layer.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
