package volume

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Keys of a volume NAME, all under "shale/NAME/" (docs/volume.md):
//
//	format          the volume's Format (JSON)
//	next            the next free inode number (decimal)
//	i/INO           inode INO: an Inode (JSON); INO is 16 hex digits
//	d/INO/NAME      directory INO's entry NAME: a Dirent (JSON)
//	x/INO/NAME      inode INO's extended attribute NAME: its value
//	g/TIME-RAND     blocks no longer referenced, for gc: a Garbage (JSON)
//	o/INO           inode INO has no links but is open on the client whose
//	                lease the key is bound to (an orphan)
//
// Inode numbers are never reused, so a token needs no generation.
type keys struct{ p string }

func newKeys(name string) keys { return keys{p: "shale/" + name + "/"} }

func (k keys) format() string          { return k.p + "format" }
func (k keys) next() string            { return k.p + "next" }
func (k keys) inode(ino uint64) string { return k.p + "i/" + hexIno(ino) }
func (k keys) dir(ino uint64) string   { return k.p + "d/" + hexIno(ino) + "/" }
func (k keys) dirent(dir uint64, name string) string {
	return k.dir(dir) + name
}
func (k keys) xattrs(ino uint64) string { return k.p + "x/" + hexIno(ino) + "/" }
func (k keys) xattr(ino uint64, name string) string {
	return k.xattrs(ino) + name
}
func (k keys) garbage() string          { return k.p + "g/" }
func (k keys) orphan(ino uint64) string { return k.p + "o/" + hexIno(ino) }

func hexIno(ino uint64) string { return fmt.Sprintf("%016x", ino) }

// parse says what a key of the volume names: its kind ('i', 'd', 'x',
// 'g' or 0), its inode and, for 'd' and 'x', the name.
func (k keys) parse(key string) (kind byte, ino uint64, name string) {
	rest, ok := strings.CutPrefix(key, k.p)
	if !ok || len(rest) < 2+16 || rest[1] != '/' {
		return 0, 0, ""
	}
	n, err := strconv.ParseUint(rest[2:18], 16, 64)
	if err != nil {
		return 0, 0, ""
	}
	if len(rest) > 19 {
		name = rest[19:]
	}
	return rest[0], n, name
}

const rootIno = 1

// Inode is an inode's record: its attributes and, for a regular file,
// its blocks; for a symlink its target.
type Inode struct {
	Mode  uint32 `json:"mode"`
	Uid   uint32 `json:"uid"`
	Gid   uint32 `json:"gid"`
	Nlink uint32 `json:"nlink"`
	Rdev  uint64 `json:"rdev,omitempty"`
	Size  uint64 `json:"size"`
	Atime int64  `json:"atime"` // nanoseconds since the epoch
	Mtime int64  `json:"mtime"`
	Ctime int64  `json:"ctime"`
	// Entries counts a directory's entries, so that rmdir can tell it is
	// empty by this one key.
	Entries int64  `json:"entries,omitempty"`
	Target  []byte `json:"target,omitempty"`
	// Blocks are the file's data, Format.BlockSize bytes each; block i
	// holds bytes [i*BlockSize, (i+1)*BlockSize). A missing or empty
	// block is a hole.
	Blocks []Block `json:"blocks,omitempty"`
	// DataVer counts the changes of the file's data, for close-to-open.
	DataVer uint64 `json:"dv,omitempty"`
	// Parent is a directory's parent (its ".."), for rename's loop check.
	Parent uint64 `json:"parent,omitempty"`
}

// Block is one block of a file: the object that holds it (written once,
// never changed) and how many of its bytes count; the rest of the block
// reads as zeros (a truncation needs no new object).
type Block struct {
	ID  string `json:"id,omitempty"`
	Len uint32 `json:"len,omitempty"`
}

// Dirent is a directory entry.
type Dirent struct {
	Ino  uint64 `json:"ino"`
	Type uint32 `json:"type"` // S_IFMT bits
}

// Garbage lists objects that no inode refers to any more, from the
// transaction that dropped them (at Time), for gc to delete later.
type Garbage struct {
	Time int64    `json:"time"`
	IDs  []string `json:"ids"`
}

func (in *Inode) isDir() bool { return in.Mode&syscall.S_IFMT == syscall.S_IFDIR }

func decodeInode(b []byte) (*Inode, error) {
	in := &Inode{}
	if err := json.Unmarshal(b, in); err != nil {
		return nil, fmt.Errorf("bad inode record: %v", err)
	}
	return in, nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own plain types always marshal
	}
	return b
}

func nowNs() int64 { return time.Now().UnixNano() }
