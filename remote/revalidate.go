package remote

import (
	"syscall"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/remote/session"
)

// Close-to-open across clients (docs/network.md, "What a client sees of
// another's changes"). A server that follows Sprite's rules answers an
// open once the opener's journal has applied every record queued for it
// then (export/sprite.go), so the records of whatever another client
// did before this open started are applied when Tlopen returns. But the
// kernel may have sent the open to the node a name had before: its
// dentry was still there, or this client's lookup was answered from the
// cache, while the record of a rename or unlink over that name was on
// its way. The open then reached the old file. stillNamed tells: an
// open of a node that no name it was reached by names any more fails
// with ESTALE, and the kernel looks the path up again (LOOKUP_REVAL)
// and opens what it names now.

// link is one name on a path: name in the directory dir names file.
type link struct {
	dir  uint64
	name string
	file uint64
}

// chainsLocked is the names from the root to each node of n's file in
// the tree, n's own first; fs.tree is held.
func (n *node) chainsLocked() [][]link {
	var out [][]link
	for _, m := range append([]*node{n}, n.fs.named[n.tok]...) {
		if m != n || len(out) == 0 {
			if ch, ok := m.chainLocked(); ok {
				out = append(out, ch)
			}
		}
	}
	return out
}

// chainLocked is m's own names from the root, nearest last.
func (m *node) chainLocked() ([]link, bool) {
	var ch []link
	for ; !m.isRoot; m = m.parent {
		if m.parent == nil {
			return nil, false
		}
		ch = append(ch, link{m.parent.tok.Ino, m.name, m.tok.Ino})
	}
	return ch, true
}

// stillNamed is 0 if a name of n's file this client knows names it
// still: each name on its path as the cache has it (a record about a
// name drops it), else as the server walks it. ESTALE if none does.
func (n *node) stillNamed(c *session.Conn, uid uint32) layer.Errno {
	if n.isRoot {
		return 0
	}
	n.fs.tree.Lock()
	chains := n.chainsLocked()
	n.fs.tree.Unlock()
	for _, ch := range chains {
		ok := true
		for _, l := range ch {
			if p, known := n.fs.cc.ChildOf(l.dir, l.name); !known || p != l.file {
				ok = false
				break
			}
		}
		if ok {
			return 0
		}
	}
	// Some name changed, or the cache forgot it: ask the server.
	fid, e := n.walkPath(c, uid)
	if e == 0 {
		go c.Clunk(fid)
	}
	if e == syscall.ESTALE {
		n.fs.ctr.staleOpens.Add(1)
		return e
	}
	return 0
}
