package remote

import "github.com/shalefs/shale/remote/session"

// defaultIdleFids is how many idle node fids a connection keeps.
const defaultIdleFids = 1024

// ownFid makes fid, walked on c for the credentials who, n's, pinned by
// the caller (see session.Fid): clunked as idle, it leaves n's fids.
func (n *node) ownFid(c *session.Conn, who, fid uint32) *session.Fid {
	return c.Own(fid, func(f *session.Fid) { n.forgetFid(who, f) })
}

// forgetFid removes f from n's fids if it is there still.
func (n *node) forgetFid(who uint32, f *session.Fid) {
	n.mu.Lock()
	if n.fids[who] == f {
		delete(n.fids, who)
	}
	n.mu.Unlock()
}

func noop() {}
