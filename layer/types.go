package layer

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Attr is what stat(2) reports about a node.
type Attr struct {
	Ino     uint64 // the inode number to report; frontends may replace it
	Mode    uint32 // type and permission bits
	Nlink   uint32
	Uid     uint32
	Gid     uint32
	Rdev    uint64
	Size    uint64
	Blocks  uint64 // 512-byte blocks
	Blksize uint32
	Atime   time.Time
	Mtime   time.Time
	Ctime   time.Time
}

// FromStatx fills a from a host statx structure.
func (a *Attr) FromStatx(st *unix.Statx_t) {
	a.Ino = st.Ino
	a.Mode = uint32(st.Mode)
	a.Nlink = st.Nlink
	a.Uid = st.Uid
	a.Gid = st.Gid
	a.Rdev = unix.Mkdev(st.Rdev_major, st.Rdev_minor)
	a.Size = st.Size
	a.Blocks = st.Blocks
	a.Blksize = st.Blksize
	a.Atime = time.Unix(st.Atime.Sec, int64(st.Atime.Nsec))
	a.Mtime = time.Unix(st.Mtime.Sec, int64(st.Mtime.Nsec))
	a.Ctime = time.Unix(st.Ctime.Sec, int64(st.Ctime.Nsec))
}

// IsDir tells whether the node is a directory.
func (a *Attr) IsDir() bool { return a.Mode&syscall.S_IFMT == syscall.S_IFDIR }

// SetAttr is a request to change attributes. Only the fields named in
// Valid are meaningful.
type SetAttr struct {
	Valid SetAttrMask
	Mode  uint32 // permission bits only
	Uid   uint32
	Gid   uint32
	Size  uint64
	Atime time.Time // with SetAtimeNow: the current time
	Mtime time.Time
}

// SetAttrMask names the fields of a SetAttr to apply.
type SetAttrMask uint32

const (
	SetMode SetAttrMask = 1 << iota
	SetUid
	SetGid
	SetSize
	SetAtime
	SetMtime
	SetAtimeNow
	SetMtimeNow
	SetCtime // ctime update only (e.g. after a chown that changed nothing)
	// SetKillSuidgid, with SetMode, says that the mode change only
	// clears setuid and setgid, as the kernel does at a write or
	// truncation by a caller other than the owner: anyone who may write
	// the file may make it (the bottom of the stack checks that, not
	// ownership, for a caller with Check).
	SetKillSuidgid
)

// Statfs is what statfs(2) reports.
type Statfs struct {
	Blocks, Bfree, Bavail uint64
	Files, Ffree          uint64
	Bsize, Frsize         uint32
	NameLen               uint32
}

// Lock is an advisory byte-range lock, as in fcntl(2): Type is F_RDLCK,
// F_WRLCK or F_UNLCK; End is inclusive, with math.MaxUint64 for "to the end
// of the file". Flock marks a whole-file flock(2) lock.
type Lock struct {
	Start, End uint64
	Type       uint32
	Pid        uint32
	Flock      bool
}

// Caller is who makes a request, and through which view.
type Caller struct {
	Uid, Gid uint32
	Pid      uint32
	View     uint32 // the frontend's view, for Event.View; 0 for none
	// Umask is the caller's umask, for Create, Mkdir and Mknod: the
	// bottom of the stack applies it, or the directory's default ACL, as
	// the lower file system would for a local program.
	Umask uint32
	// Supp is the caller's supplementary groups when the frontend knows
	// them (9P: from the user database); nil when it does not (FUSE), and
	// Groups reads them from /proc. Non-nil and empty is "no groups".
	Supp []uint32
	// Check says that the frontend has not checked permissions (9P), as
	// a FUSE mount with default_permissions has. The bottom of the stack
	// must then perform every operation with the caller's full
	// credentials: fsuid Uid, fsgid Gid, the groups of Groups (set Supp,
	// or Pid must name a live process), and no capabilities unless Uid is
	// 0; so that the lower file system checks them itself, exactly as for
	// a local program of that user. Without it, the bottom of the stack
	// may act with its own privileges.
	Check bool
	// Squashed says that Uid and Gid are nobody's standing in for a
	// client's root (the 9P export's root squash), for its messages.
	Squashed bool
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller carried by ctx. Frontends attach it; code
// that runs on shale's own behalf carries none and acts as the process.
func CallerOf(ctx context.Context) (Caller, bool) {
	if c, ok := ctx.Value(callerKey{}).(Caller); ok {
		return c, true
	}
	return Caller{}, false
}

// AsSelf returns ctx without its caller, for a request a layer makes on
// its own behalf once the caller's own request has been allowed: reading
// what the layer keeps for itself (a directory's identity), or reading a
// file the caller may only write, to write it in blocks. The bottom of
// the stack then acts as the process. The caller's view stays (ViewOf):
// the view must not hear of its own change as of one from beside it,
// which it would push into the kernel while the kernel waits on it.
func AsSelf(ctx context.Context) context.Context {
	c, _ := CallerOf(ctx)
	return context.WithValue(context.WithValue(ctx, callerKey{}, nil), viewKey{}, c.View)
}

type viewKey struct{}

// ViewOf returns the view whose request ctx serves (Event.View), 0 for
// none.
func ViewOf(ctx context.Context) uint32 {
	if c, ok := CallerOf(ctx); ok {
		return c.View
	}
	v, _ := ctx.Value(viewKey{}).(uint32)
	return v
}

// Groups returns the caller's supplementary groups: Supp if the frontend
// gave them; otherwise (FUSE does not send them) they are read from the
// caller's process in /proc.
func (c Caller) Groups() ([]uint32, error) {
	if c.Supp != nil {
		return c.Supp, nil
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", c.Pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "Groups:")
		if !ok {
			continue
		}
		var gs []uint32
		for _, w := range strings.Fields(rest) {
			g, err := strconv.ParseUint(w, 10, 32)
			if err != nil {
				return nil, err
			}
			gs = append(gs, uint32(g))
		}
		return gs, nil
	}
	return nil, fmt.Errorf("no Groups line in /proc/%d/status", c.Pid)
}
