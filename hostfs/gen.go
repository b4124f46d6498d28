package hostfs

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// A token is a file's inode number (mixed with its device off the root's
// file system) and a generation, which tells a file apart from an earlier
// one whose inode number it reuses: file systems hand a freed number to
// the next file made, and a view that took the new file for the old would
// serve it from the old one's node. The generation is, by the first rule
// that applies:
//
//  1. The birth time, in nanoseconds, where statx reports one (STATX_BTIME
//     in stx_mask: tmpfs, ext4, xfs, btrfs). A new file is born later.
//  2. A hash of the file's handle (name_to_handle_at), where the file
//     system has handles: they must not name a new file that reuses a
//     number, so they hold the inode's generation too (ext2 and ext3 with
//     128-byte inodes, which have no birth time, hold i_generation, the
//     value FS_IOC_GETVERSION gives; FUSE holds the server's generation).
//     Handles come from the O_PATH descriptor, for every type of file;
//     FS_IOC_GETVERSION would need an open, which fails on O_PATH and has
//     effects on devices and fifos.
//  3. Neither (ramfs, 9p): a number this process mints, kept while a node
//     holds the file. A node's descriptor keeps the inode, and so its
//     number, from being freed (nodes of files without handles keep their
//     descriptors, fds.go), so while one lives no other file can have the
//     number; a file no node holds gets a new number when next found,
//     which nothing held can match. Minting starts at a random number, so
//     that another run of shale does not give the same ones.
//
// A generation is never 0: a rule that would give 0 gives way to the next
// (a birth time of 0 is a file system that does not keep one), or 1, so
// that a zero Token is no file's.

// minted is rule 3's generations, by inode number.
type minted struct {
	mu   sync.Mutex
	next uint64
	held map[uint64]*mint
}

type mint struct {
	gen   uint64
	nodes int
}

// gen gives the generation of the file st describes, which fd holds or, if
// name is not "", name in directory fd has. With hold, a node is made of
// it: a minted generation is kept until the node forgets it (release).
func (fs *FS) gen(fd int, name string, st *unix.Statx_t, ino uint64, hold bool) uint64 {
	if st.Mask&unix.STATX_BTIME != 0 {
		if g := uint64(st.Btime.Sec)*1e9 + uint64(st.Btime.Nsec); g != 0 {
			return g
		}
	}
	flags := 0
	if name == "" {
		flags = unix.AT_EMPTY_PATH
	}
	if fh, _, err := unix.NameToHandleAt(fd, name, flags); err == nil {
		h := fnv.New64a()
		h.Write(binary.NativeEndian.AppendUint32(nil, uint32(fh.Type())))
		h.Write(fh.Bytes())
		return max(h.Sum64(), 1)
	}
	return fs.minted.gen(ino, hold)
}

func (m *minted) gen(ino uint64, hold bool) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.held[ino]; e != nil {
		if hold {
			e.nodes++
		}
		return e.gen
	}
	if m.held == nil {
		m.held, m.next = map[uint64]*mint{}, rand.Uint64()
	}
	if m.next++; m.next == 0 {
		m.next++
	}
	if hold {
		m.held[ino] = &mint{gen: m.next, nodes: 1}
	}
	return m.next
}

// release tells that a node of tok is forgotten.
func (m *minted) release(tok layer.Token) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.held[tok.Ino]; e != nil && e.gen == tok.Gen {
		if e.nodes--; e.nodes == 0 {
			delete(m.held, tok.Ino)
		}
	}
}
