package remote

import (
	"errors"
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

// chainLocked is m's own names up to the root, its own first.
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
// name drops it), else as the server walks it. ESTALE if none does; 0
// for a file with no name (this client removed it: it is opened by a
// descriptor, not a name).
func (n *node) stillNamed(c *session.Conn, who uint32) layer.Errno {
	if n.isRoot {
		return 0
	}
	n.fs.tree.Lock()
	chains := n.chainsLocked()
	n.fs.tree.Unlock()
	if len(chains) == 0 {
		return 0 // no name: this client removed them, and opens it by a descriptor (/proc/PID/fd)
	}
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
	// Some name changed, or the cache forgot it (this client's own
	// renames drop the names they make): ask the server, and keep the
	// name it confirms, so that the next open asks nothing.
	since := n.fs.cc.Snap()
	rfid, err := c.Root(who)
	if err != nil {
		return 0 // the open stands; the connection's trouble shows next
	}
	for _, ch := range chains {
		names := make([]string, len(ch))
		for i, l := range ch {
			names[len(ch)-1-i] = l.name
		}
		fid, q, err := c.Walk(rfid, names)
		if err == nil {
			go c.Clunk(fid)
		}
		switch {
		case errors.Is(err, syscall.ENOENT) || err == nil && q.Path != n.tok.Ino:
			continue // this name is another file's now, or none's
		case err != nil:
			return 0
		}
		n.fs.cc.PutName(since, ch[0].dir, ch[0].name, ch[0].file)
		return 0
	}
	n.fs.ctr.staleOpens.Add(1)
	return syscall.ESTALE
}
