package hostfs

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// Check mode is judged against the host kernel itself: every step runs
// natively, in a child process with the caller's credentials, and through
// hostfs with Check, each on its own copy of the same tree; both must give
// the same errno and result, and leave the same trees.

const (
	otherUid = 4242 // the owner of most of the tree: nobody the tests play
	inGrp    = 5001 // a supplementary group of user 1000
	outGrp   = 5003 // a group no user the tests play is in
	callMask = 0o022
)

type checkUser struct {
	uid, gid uint32
	supp     []uint32
}

var checkUsers = []checkUser{
	{1000, 1000, []uint32{inGrp, 5002}},
	{65534, 65534, []uint32{}},
}

func (u checkUser) ctx() context.Context {
	return layer.WithCaller(ctx, layer.Caller{Uid: u.uid, Gid: u.gid, Supp: u.supp, Umask: callMask, Check: true})
}

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root: run the suite as root")
	}
}

// POSIX ACL tags, as system.posix_acl_access stores them.
const (
	aclUserObj  = 0x01
	aclUser     = 0x02
	aclGroupObj = 0x04
	aclGroup    = 0x08
	aclMask     = 0x10
	aclOther    = 0x20
	aclNoID     = math.MaxUint32
)

// aclXattr encodes entries {tag, perm, id}, which must be sorted by tag and
// id, as the kernel's xattr form of an access ACL (version 2).
func aclXattr(entries ...[3]uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, uint16(e[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(e[1]))
		b = binary.LittleEndian.AppendUint32(b, e[2])
	}
	return b
}

// checkTree makes, as root, the tree the steps act on, for user u, in a
// new directory that u can reach.
func checkTree(t *testing.T, u checkUser) string {
	t.Helper()
	base, err := os.MkdirTemp("", "hostfs-check-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// unix.Chmod: os.Chmod takes setuid and sticky as os.Mode bits only.
	file := func(name string, mode uint32, uid, gid int) {
		t.Helper()
		p := filepath.Join(base, name)
		must(os.WriteFile(p, []byte(name), 0))
		must(os.Chown(p, uid, gid))
		must(unix.Chmod(p, mode))
	}
	dir := func(name string, mode uint32, uid, gid int) {
		t.Helper()
		p := filepath.Join(base, name)
		must(os.Mkdir(p, 0))
		must(os.Chown(p, uid, gid))
		must(unix.Chmod(p, mode))
	}
	uid, gid := int(u.uid), int(u.gid)
	must(os.Chmod(base, 0o755))
	file("mine", 0o644, uid, gid)
	file("mineog", 0o644, uid, outGrp) // the owner is not in its group
	file("other600", 0o600, otherUid, otherUid)
	file("other644", 0o644, otherUid, otherUid)
	file("other666", 0o666, otherUid, otherUid)
	file("grp640", 0o640, otherUid, inGrp)
	file("acl600", 0o600, otherUid, otherUid)
	must(unix.Setxattr(filepath.Join(base, "acl600"), "system.posix_acl_access", aclXattr(
		[3]uint32{aclUserObj, 6, aclNoID}, [3]uint32{aclUser, 4, u.uid},
		[3]uint32{aclGroupObj, 0, aclNoID}, [3]uint32{aclMask, 4, aclNoID}, [3]uint32{aclOther, 0, aclNoID}), 0))
	file("aclg600", 0o600, otherUid, otherUid)
	must(unix.Setxattr(filepath.Join(base, "aclg600"), "system.posix_acl_access", aclXattr(
		[3]uint32{aclUserObj, 6, aclNoID}, [3]uint32{aclGroupObj, 0, aclNoID}, [3]uint32{aclGroup, 4, inGrp},
		[3]uint32{aclMask, 4, aclNoID}, [3]uint32{aclOther, 0, aclNoID}), 0))
	file("suid", 0o4777, otherUid, otherUid)
	file("xattr600", 0o600, otherUid, otherUid)
	must(unix.Setxattr(filepath.Join(base, "xattr600"), "user.k", []byte("v"), 0))
	must(unix.Setxattr(filepath.Join(base, "mine"), "user.k", []byte("mine's"), 0))
	file("trusted", 0o644, otherUid, otherUid)
	must(unix.Setxattr(filepath.Join(base, "trusted"), "trusted.k", []byte("v"), 0))
	must(os.Symlink("mine", filepath.Join(base, "link")))
	dir("priv", 0o700, otherUid, otherUid)
	file("priv/f", 0o644, otherUid, otherUid)
	dir("ro", 0o755, otherUid, otherUid)
	dir("open", 0o777, 0, 0)
	file("open/a", 0o644, uid, gid)
	dir("open2", 0o777, 0, 0)
	dir("sticky", 0o1777, 0, 0)
	file("sticky/theirs", 0o666, otherUid, otherUid)
	file("sticky/ours", 0o644, uid, gid)
	dir("sticky/theirdir", 0o777, otherUid, otherUid)
	return base
}

// A step acts on a tree, natively by path or through hostfs, and gives a
// result to compare besides its error.
type checkStep struct {
	name   string
	native func(base string) (string, error)
	viaFS  func(v *viaFS) (string, error)
}

// viaFS reaches paths of a tree through hostfs, walking as the caller.
type viaFS struct {
	t    *testing.T
	ctx  context.Context
	root layer.Node
}

func err0(e layer.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func (v *viaFS) walk(path string) (layer.Node, error) {
	n := v.root
	if path == "" {
		return n, nil
	}
	for _, name := range strings.Split(path, "/") {
		var a layer.Attr
		c, e := n.Lookup(v.ctx, name, &a)
		if e != 0 {
			return nil, e
		}
		v.t.Cleanup(c.Forget)
		n = c
	}
	return n, nil
}

// parent walks to path's directory and returns it with path's last name.
func (v *viaFS) parent(path string) (layer.Node, string, error) {
	dir, name := filepath.Split(path)
	d, err := v.walk(strings.TrimSuffix(dir, "/"))
	return d, name, err
}

func (v *viaFS) setattr(path string, in layer.SetAttr) error {
	n, err := v.walk(path)
	if err != nil {
		return err
	}
	var a layer.Attr
	return err0(n.Setattr(v.ctx, nil, &in, &a))
}

// openStep opens path with flags, reads what it can, and writes "w" at 0
// if asked.
func openStep(name, path string, flags int, write bool) checkStep {
	return checkStep{name: name,
		native: func(b string) (string, error) {
			fd, err := unix.Open(filepath.Join(b, path), flags|unix.O_CLOEXEC, 0)
			if err != nil {
				return "", err
			}
			defer unix.Close(fd)
			if write {
				_, err = unix.Pwrite(fd, []byte("w"), 0)
				return "", err
			}
			buf := make([]byte, 64)
			k, err := unix.Pread(fd, buf, 0)
			if err != nil {
				return "", err
			}
			return string(buf[:k]), nil
		},
		viaFS: func(v *viaFS) (string, error) {
			n, err := v.walk(path)
			if err != nil {
				return "", err
			}
			h, e := n.Open(v.ctx, uint32(flags))
			if e != 0 {
				return "", e
			}
			defer h.Release(v.ctx)
			if write {
				_, e = h.Write(v.ctx, []byte("w"), 0)
				return "", err0(e)
			}
			buf := make([]byte, 64)
			k, e := h.Read(v.ctx, buf, 0)
			if e != 0 {
				return "", e
			}
			return string(buf[:k]), nil
		}}
}

// only is a step's outcome when it has no result but its error.
func only(err error) (string, error) { return "", err }

// checkSteps are run in order, the same on both sides; later steps see
// what earlier ones did.
func checkSteps(u checkUser) []checkStep {
	uid := u.uid
	past := time.Unix(1e9, 0)
	return []checkStep{
		openStep("read 0600 of another", "other600", unix.O_RDONLY, false),
		openStep("write 0600 of another", "other600", unix.O_WRONLY, true),
		openStep("read 0644 of another", "other644", unix.O_RDONLY, false),
		openStep("write 0644 of another", "other644", unix.O_WRONLY, true),
		openStep("O_TRUNC 0644 of another", "other644", unix.O_WRONLY|unix.O_TRUNC, true),
		openStep("read 0640 through a supplementary group", "grp640", unix.O_RDONLY, false),
		openStep("read granted by a user ACL", "acl600", unix.O_RDONLY, false),
		openStep("write not granted by a user ACL", "acl600", unix.O_WRONLY, true),
		openStep("read granted by a group ACL", "aclg600", unix.O_RDONLY, false),
		openStep("O_NOATIME of another's", "other644", unix.O_RDONLY|unix.O_NOATIME, false),
		openStep("O_NOATIME of one's own", "mine", unix.O_RDONLY|unix.O_NOATIME, false),
		openStep("write to a setuid file (clears setuid)", "suid", unix.O_WRONLY, true),
		{name: "lookup in a 0700 dir of another",
			native: func(b string) (string, error) {
				var st unix.Stat_t
				return only(unix.Lstat(filepath.Join(b, "priv/f"), &st))
			},
			viaFS: func(v *viaFS) (string, error) { _, err := v.walk("priv/f"); return only(err) }},
		{name: "readdir of a 0700 dir of another",
			native: func(b string) (string, error) {
				fd, err := unix.Open(filepath.Join(b, "priv"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
				if err == nil {
					unix.Close(fd)
				}
				return only(err)
			},
			viaFS: func(v *viaFS) (string, error) {
				n, err := v.walk("priv")
				if err != nil {
					return "", err
				}
				d, e := n.OpenDir(v.ctx)
				if e == 0 {
					d.Close()
				}
				return only(err0(e))
			}},
		{name: "readdir of a 0755 dir",
			native: func(b string) (string, error) {
				es, err := os.ReadDir(filepath.Join(b, "sticky"))
				var names []string
				for _, e := range es {
					names = append(names, e.Name())
				}
				slices.Sort(names)
				return strings.Join(names, " "), unwrap(err)
			},
			viaFS: func(v *viaFS) (string, error) {
				n, err := v.walk("sticky")
				if err != nil {
					return "", err
				}
				d, e := n.OpenDir(v.ctx)
				if e != 0 {
					return "", e
				}
				defer d.Close()
				var names []string
				for {
					de, ok, e := d.Next(v.ctx)
					if e != 0 {
						return "", e
					}
					if !ok {
						break
					}
					if de.Name != "." && de.Name != ".." {
						names = append(names, de.Name)
					}
				}
				slices.Sort(names)
				return strings.Join(names, " "), nil
			}},
		{name: "create in a dir without write",
			native: func(b string) (string, error) {
				fd, err := unix.Open(filepath.Join(b, "ro/new"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o644)
				if err == nil {
					unix.Close(fd)
				}
				return only(err)
			},
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("ro")
				var a layer.Attr
				_, h, e := d.Create(v.ctx, "new", unix.O_EXCL|unix.O_WRONLY, 0o644, &a)
				if e == 0 {
					h.Release(v.ctx)
				}
				return only(err0(e))
			}},
		{name: "mkdir in a dir without write",
			native: func(b string) (string, error) { return only(unix.Mkdir(filepath.Join(b, "ro/d"), 0o755)) },
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("ro")
				var a layer.Attr
				_, e := d.Mkdir(v.ctx, "d", 0o755, &a)
				return only(err0(e))
			}},
		{name: "symlink in a dir without write",
			native: func(b string) (string, error) { return only(unix.Symlink("x", filepath.Join(b, "ro/l"))) },
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("ro")
				var a layer.Attr
				_, e := d.Symlink(v.ctx, []byte("x"), "l", &a)
				return only(err0(e))
			}},
		{name: "create with a mode and umask",
			native: func(b string) (string, error) {
				fd, err := unix.Open(filepath.Join(b, "open/new"), unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY, 0o666)
				if err == nil {
					unix.Close(fd)
				}
				return only(err)
			},
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("open")
				var a layer.Attr
				c, h, e := d.Create(v.ctx, "new", unix.O_EXCL|unix.O_WRONLY, 0o666, &a)
				if e == 0 {
					h.Release(v.ctx)
					c.Forget()
				}
				return only(err0(e))
			}},
		{name: "mkfifo",
			native: func(b string) (string, error) { return only(unix.Mkfifo(filepath.Join(b, "open/fifo"), 0o640)) },
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("open")
				var a layer.Attr
				c, e := d.Mknod(v.ctx, "fifo", unix.S_IFIFO|0o640, 0, &a)
				if e == 0 {
					c.Forget()
				}
				return only(err0(e))
			}},
		{name: "unlink of another's file in a sticky dir",
			native: func(b string) (string, error) { return only(unix.Unlink(filepath.Join(b, "sticky/theirs"))) },
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("sticky")
				return only(err0(d.Unlink(v.ctx, "theirs")))
			}},
		{name: "rmdir of another's dir in a sticky dir",
			native: func(b string) (string, error) { return only(unix.Rmdir(filepath.Join(b, "sticky/theirdir"))) },
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("sticky")
				return only(err0(d.Rmdir(v.ctx, "theirdir")))
			}},
		renameStep("rename of another's file out of a sticky dir", "sticky/theirs", "open/theirs"),
		renameStep("rename into a dir without write", "open/a", "ro/a"),
		renameStep("rename across dirs", "open/a", "open2/a"),
		{name: "unlink of one's own file in a sticky dir",
			native: func(b string) (string, error) { return only(unix.Unlink(filepath.Join(b, "sticky/ours"))) },
			viaFS: func(v *viaFS) (string, error) {
				d, _ := v.walk("sticky")
				return only(err0(d.Unlink(v.ctx, "ours")))
			}},
		{name: "hard link to another's 0600 file (protected_hardlinks)",
			native: func(b string) (string, error) {
				return only(unix.Link(filepath.Join(b, "other600"), filepath.Join(b, "open/l600")))
			},
			viaFS: func(v *viaFS) (string, error) { return only(v.link("other600", "open/l600")) }},
		{name: "hard link to one's own file",
			native: func(b string) (string, error) {
				return only(unix.Link(filepath.Join(b, "mine"), filepath.Join(b, "open/lmine")))
			},
			viaFS: func(v *viaFS) (string, error) { return only(v.link("mine", "open/lmine")) }},
		{name: "chmod of another's file",
			native: func(b string) (string, error) { return only(unix.Chmod(filepath.Join(b, "other644"), 0o666)) },
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("other644", layer.SetAttr{Valid: layer.SetMode, Mode: 0o666}))
			}},
		{name: "chmod g+s of one's own file of a group one is not in (setgid dropped)",
			native: func(b string) (string, error) { return only(unix.Chmod(filepath.Join(b, "mineog"), 0o2755)) },
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("mineog", layer.SetAttr{Valid: layer.SetMode, Mode: 0o2755}))
			}},
		chownStep("chown to another uid", "mine", int(otherUid), -1),
		chownStep("chgrp to a group one is not in", "mine", -1, outGrp),
		chownStep("chgrp to a supplementary group", "mine", -1, inGrp),
		chownStep("chown to oneself", "mine", int(uid), -1),
		{name: "utimes with explicit times on another's 0666 file",
			native: func(b string) (string, error) {
				ts := []unix.Timespec{unix.NsecToTimespec(past.UnixNano()), unix.NsecToTimespec(past.UnixNano())}
				return only(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(b, "other666"), ts, 0))
			},
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("other666", layer.SetAttr{Valid: layer.SetAtime | layer.SetMtime, Atime: past, Mtime: past}))
			}},
		{name: "utimes now on another's 0666 file",
			native: func(b string) (string, error) {
				ts := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
				return only(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(b, "other666"), ts, 0))
			},
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("other666", layer.SetAttr{Valid: layer.SetAtimeNow | layer.SetMtimeNow}))
			}},
		{name: "utimes now on another's 0644 file",
			native: func(b string) (string, error) {
				ts := []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_NOW}}
				return only(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(b, "other644"), ts, 0))
			},
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("other644", layer.SetAttr{Valid: layer.SetAtimeNow | layer.SetMtimeNow}))
			}},
		{name: "truncate without write",
			native: func(b string) (string, error) { return only(unix.Truncate(filepath.Join(b, "other644"), 1)) },
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("other644", layer.SetAttr{Valid: layer.SetSize, Size: 1}))
			}},
		{name: "truncate with write",
			native: func(b string) (string, error) { return only(unix.Truncate(filepath.Join(b, "other666"), 1)) },
			viaFS: func(v *viaFS) (string, error) {
				return only(v.setattr("other666", layer.SetAttr{Valid: layer.SetSize, Size: 1}))
			}},
		getxattrStep("getxattr user.* without read", "xattr600", "user.k"),
		getxattrStep("getxattr user.* of one's own", "mine", "user.k"),
		getxattrStep("getxattr trusted.* (CAP_SYS_ADMIN only)", "trusted", "trusted.k"),
		listxattrStep("listxattr without read", "xattr600"),
		listxattrStep("listxattr hides trusted.*", "trusted"),
		{name: "setxattr user.* without write",
			native: func(b string) (string, error) {
				return only(unix.Setxattr(filepath.Join(b, "other644"), "user.n", []byte("x"), 0))
			},
			viaFS: func(v *viaFS) (string, error) {
				n, err := v.walk("other644")
				if err != nil {
					return "", err
				}
				return only(err0(n.Setxattr(v.ctx, "user.n", []byte("x"), 0)))
			}},
		{name: "setxattr trusted.* on one's own",
			native: func(b string) (string, error) {
				return only(unix.Setxattr(filepath.Join(b, "mine"), "trusted.n", []byte("x"), 0))
			},
			viaFS: func(v *viaFS) (string, error) {
				n, err := v.walk("mine")
				if err != nil {
					return "", err
				}
				return only(err0(n.Setxattr(v.ctx, "trusted.n", []byte("x"), 0)))
			}},
		{name: "readlink",
			native: func(b string) (string, error) {
				s, err := os.Readlink(filepath.Join(b, "link"))
				return s, unwrap(err)
			},
			viaFS: func(v *viaFS) (string, error) {
				n, err := v.walk("link")
				if err != nil {
					return "", err
				}
				s, e := n.Readlink(v.ctx)
				return string(s), err0(e)
			}},
		{name: "write lock on a read-only open file",
			native: func(b string) (string, error) {
				fd, err := unix.Open(filepath.Join(b, "other644"), unix.O_RDONLY, 0)
				if err != nil {
					return "", err
				}
				defer unix.Close(fd)
				return only(unix.FcntlFlock(uintptr(fd), unix.F_SETLK, &unix.Flock_t{Type: unix.F_WRLCK}))
			},
			viaFS: func(v *viaFS) (string, error) {
				n, err := v.walk("other644")
				if err != nil {
					return "", err
				}
				h, e := n.Open(v.ctx, unix.O_RDONLY)
				if e != 0 {
					return "", e
				}
				defer h.Release(v.ctx)
				return only(err0(h.Setlk(v.ctx, 1, &layer.Lock{End: math.MaxUint64, Type: unix.F_WRLCK}, false)))
			}},
		{name: "statfs",
			native: func(b string) (string, error) {
				var st unix.Statfs_t
				return only(unix.Statfs(b, &st))
			},
			viaFS: func(v *viaFS) (string, error) {
				var st layer.Statfs
				return only(err0(v.root.Statfs(v.ctx, &st)))
			}},
	}
}

func unwrap(err error) error {
	if pe, ok := err.(*fs.PathError); ok {
		return pe.Err
	}
	if le, ok := err.(*os.LinkError); ok {
		return le.Err
	}
	return err
}

func (v *viaFS) link(from, to string) error {
	t, err := v.walk(from)
	if err != nil {
		return err
	}
	d, name, err := v.parent(to)
	if err != nil {
		return err
	}
	var a layer.Attr
	c, e := d.Link(v.ctx, t, name, &a)
	if e == 0 {
		c.Forget()
	}
	return err0(e)
}

func renameStep(name, from, to string) checkStep {
	return checkStep{name: name,
		native: func(b string) (string, error) {
			return only(unix.Rename(filepath.Join(b, from), filepath.Join(b, to)))
		},
		viaFS: func(v *viaFS) (string, error) {
			fd, fname, err := v.parent(from)
			if err != nil {
				return "", err
			}
			td, tname, err := v.parent(to)
			if err != nil {
				return "", err
			}
			return only(err0(fd.Rename(v.ctx, fname, td, tname, 0)))
		}}
}

func chownStep(name, path string, uid, gid int) checkStep {
	return checkStep{name: name,
		native: func(b string) (string, error) { return only(unix.Lchown(filepath.Join(b, path), uid, gid)) },
		viaFS: func(v *viaFS) (string, error) {
			in := layer.SetAttr{}
			if uid >= 0 {
				in.Valid |= layer.SetUid
				in.Uid = uint32(uid)
			}
			if gid >= 0 {
				in.Valid |= layer.SetGid
				in.Gid = uint32(gid)
			}
			return only(v.setattr(path, in))
		}}
}

func getxattrStep(name, path, attr string) checkStep {
	return checkStep{name: name,
		native: func(b string) (string, error) {
			buf := make([]byte, 64)
			k, err := unix.Lgetxattr(filepath.Join(b, path), attr, buf)
			if err != nil {
				return "", err
			}
			return string(buf[:k]), nil
		},
		viaFS: func(v *viaFS) (string, error) {
			n, err := v.walk(path)
			if err != nil {
				return "", err
			}
			buf := make([]byte, 64)
			k, e := n.Getxattr(v.ctx, attr, buf)
			if e != 0 {
				return "", e
			}
			return string(buf[:k]), nil
		}}
}

func listxattrStep(name, path string) checkStep {
	names := func(buf []byte) string {
		ns := strings.Split(strings.TrimSuffix(string(buf), "\x00"), "\x00")
		slices.Sort(ns)
		return strings.Join(ns, " ")
	}
	return checkStep{name: name,
		native: func(b string) (string, error) {
			buf := make([]byte, 256)
			k, err := unix.Llistxattr(filepath.Join(b, path), buf)
			if err != nil {
				return "", err
			}
			return names(buf[:k]), nil
		},
		viaFS: func(v *viaFS) (string, error) {
			n, err := v.walk(path)
			if err != nil {
				return "", err
			}
			buf := make([]byte, 256)
			k, e := n.Listxattr(v.ctx, buf)
			if e != 0 {
				return "", e
			}
			return names(buf[:k]), nil
		}}
}

// Environment of the child that runs the steps natively.
const (
	nativeBaseEnv = "HOSTFS_CHECK_NATIVE_BASE"
	nativeUserEnv = "HOSTFS_CHECK_NATIVE_USER"
)

// TestCheckNativeChild is the child: it runs the steps on the tree named
// in its environment, with the credentials it was started with.
func TestCheckNativeChild(t *testing.T) {
	base := os.Getenv(nativeBaseEnv)
	if base == "" {
		t.Skip("run by TestCheckMatchesHost")
	}
	i, _ := strconv.Atoi(os.Getenv(nativeUserEnv))
	unix.Umask(callMask)
	for k, s := range checkSteps(checkUsers[i]) {
		res, err := s.native(base)
		fmt.Printf("STEP\t%d\t%d\t%q\n", k, errnoOf(err), res)
	}
}

func errnoOf(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	if e, ok := err.(syscall.Errno); ok {
		return e
	}
	return syscall.Errno(math.MaxInt32) // not an errno: never matches
}

type stepResult struct {
	e   syscall.Errno
	res string
}

// runNative runs the steps for user i in a child with u's credentials.
func runNative(t *testing.T, bin, base string, i int, u checkUser) []stepResult {
	cmd := exec.Command(bin, "-test.run=^TestCheckNativeChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), nativeBaseEnv+"="+base, nativeUserEnv+"="+strconv.Itoa(i))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.supp}}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("native child: %v\n%s%s", err, out, stderr.Bytes())
	}
	var rs []stepResult
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.SplitN(sc.Text(), "\t", 4)
		if len(f) != 4 || f[0] != "STEP" {
			continue
		}
		e, _ := strconv.Atoi(f[2])
		res, err := strconv.Unquote(f[3])
		if err != nil {
			t.Fatalf("native child: %q: %v", sc.Text(), err)
		}
		rs = append(rs, stepResult{syscall.Errno(e), res})
	}
	return rs
}

// executableCopy copies the test binary where every user can run it: the
// build directory is root's alone.
func executableCopy(t *testing.T) string {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "hostfs-check-bin-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	bin := filepath.Join(dir, "hostfs.test")
	out, err := os.OpenFile(bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return bin
}

// snapshot describes every file of a tree but its times, for comparing.
func snapshot(t *testing.T, base string) map[string]string {
	m := map[string]string{}
	filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(base, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		desc := fmt.Sprintf("mode %o uid %d gid %d size %d", st.Mode, st.Uid, st.Gid, st.Size)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			data, _ := os.ReadFile(p)
			desc += fmt.Sprintf(" data %q", data)
		case unix.S_IFLNK:
			l, _ := os.Readlink(p)
			desc += " -> " + l
		}
		if st.Mode&unix.S_IFMT == unix.S_IFREG || st.Mode&unix.S_IFMT == unix.S_IFDIR {
			buf := make([]byte, 1024)
			k, _ := unix.Llistxattr(p, buf)
			ns := strings.Split(string(buf[:k]), "\x00")
			slices.Sort(ns)
			desc += " xattrs" + strings.Join(ns, " ")
		}
		m[rel] = desc
		return nil
	})
	return m
}

// Every step gives through hostfs with Check what it gives a local program
// of the same user and groups, and leaves the same tree.
func TestCheckMatchesHost(t *testing.T) {
	needRoot(t)
	bin := executableCopy(t)
	for i, u := range checkUsers {
		t.Run(fmt.Sprintf("uid%d", u.uid), func(t *testing.T) {
			steps := checkSteps(u)
			nbase := checkTree(t, u)
			native := runNative(t, bin, nbase, i, u)
			if len(native) != len(steps) {
				t.Fatalf("native child ran %d steps of %d", len(native), len(steps))
			}
			fbase := checkTree(t, u)
			root, err := New(stack.New(stack.Options{}), fbase)
			if err != nil {
				t.Fatal(err)
			}
			defer root.Forget()
			v := &viaFS{t: t, ctx: u.ctx(), root: root}
			denied := 0
			for k, s := range steps {
				res, err := s.viaFS(v)
				got := stepResult{errnoOf(err), res}
				if got != native[k] {
					t.Errorf("%s: hostfs gives %v %q, natively %v %q", s.name, got.e, got.res, native[k].e, native[k].res)
				}
				t.Logf("%-60s %v %q", s.name, native[k].e, native[k].res)
				if native[k].e != 0 {
					denied++
				}
			}
			if denied < 15 {
				t.Errorf("only %d steps denied natively: the tree does not test much", denied)
			}
			// The kernel's own clearing, which only the caller's
			// credentials trigger (no CAP_FSETID).
			var st unix.Stat_t
			if unix.Lstat(filepath.Join(fbase, "suid"), &st) != nil || st.Mode&unix.S_ISUID != 0 {
				t.Errorf("setuid file written through hostfs has mode %o", st.Mode)
			}
			if unix.Lstat(filepath.Join(fbase, "mineog"), &st) != nil || st.Mode&unix.S_ISGID != 0 {
				t.Errorf("chmod g+s by an owner outside the group gives mode %o", st.Mode)
			}
			ns, fsn := snapshot(t, nbase), snapshot(t, fbase)
			for p, d := range ns {
				if fsn[p] != d {
					t.Errorf("%s: through hostfs %s, natively %s", p, fsn[p], d)
				}
			}
			for p, d := range fsn {
				if _, ok := ns[p]; !ok {
					t.Errorf("%s: made through hostfs (%s), not natively", p, d)
				}
			}
		})
	}
}

// threadCreds is what /proc says of the calling thread's credentials.
func threadCreds(t testing.TB) string {
	data, err := os.ReadFile("/proc/thread-self/status")
	if err != nil {
		t.Fatal(err)
	}
	var keep []string
	for _, l := range strings.Split(string(data), "\n") {
		for _, k := range []string{"Uid:", "Gid:", "Groups:", "CapInh:", "CapPrm:", "CapEff:", "CapAmb:"} {
			if strings.HasPrefix(l, k) {
				keep = append(keep, l)
			}
		}
	}
	return strings.Join(keep, "\n")
}

// credLine is the value of the line of threadCreds that key starts.
func credLine(creds, key string) string {
	for _, l := range strings.Split(creds, "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

// restoreTree is a 0700 dir and a 0600 file of another user, which only
// root's capabilities open, and a 0600 file of root's.
func restoreTree(t *testing.T) (string, layer.Node) {
	dir, root := newFS(t)
	os.Chmod(dir, 0o755)
	for _, f := range []struct {
		name string
		uid  int
		mode os.FileMode
	}{{"theirs", otherUid, 0o600}, {"roots", 0, 0o600}, {"public", otherUid, 0o644}} {
		p := filepath.Join(dir, f.name)
		os.WriteFile(p, []byte(f.name), 0)
		os.Chown(p, f.uid, f.uid)
		os.Chmod(p, f.mode)
	}
	os.Mkdir(filepath.Join(dir, "d"), 0o700)
	os.Chown(filepath.Join(dir, "d"), otherUid, otherUid)
	return dir, root
}

func readAs(ctx context.Context, n layer.Node) layer.Errno {
	h, e := n.Open(ctx, unix.O_RDONLY)
	if e != 0 {
		return e
	}
	defer h.Release(ctx)
	_, e = h.Read(ctx, make([]byte, 8), 0)
	return e
}

// A Check operation leaves its thread as it found it, even one an earlier
// creating operation of a FUSE caller left with SECBIT_NO_SETUID_FIXUP:
// that bit must not let the Check caller keep root's capabilities.
func TestCheckRestoresThread(t *testing.T) {
	needRoot(t)
	_, root := restoreTree(t)
	theirs, roots, public, d := lookup(t, root, "theirs"), lookup(t, root, "roots"), lookup(t, root, "public"), lookup(t, root, "d")
	runtime.LockOSThread() // every operation below runs on this thread
	defer runtime.UnlockOSThread()
	before := threadCreds(t)
	var a layer.Attr
	fuse := layer.WithCaller(ctx, layer.Caller{Uid: 1000, Gid: 1000})
	c, e := root.Mkdir(fuse, "fusemade", 0o755, &a)
	if e != 0 {
		t.Fatal(e)
	}
	c.Forget()
	if a.Uid != 1000 {
		t.Fatalf("made for a FUSE caller: uid %d", a.Uid)
	}
	for i := 0; i < 4; i++ {
		nobody := checkUsers[i%2].ctx() // with and without groups
		if e := readAs(nobody, theirs); e != syscall.EACCES {
			t.Errorf("Check caller reads another's 0600 file: %v, want EACCES", e)
		}
		if e := readAs(nobody, roots); e != syscall.EACCES {
			t.Errorf("Check caller reads root's 0600 file: %v, want EACCES", e)
		}
		if e := readAs(nobody, public); e != 0 {
			t.Errorf("Check caller reads a 0644 file: %v", e)
		}
		if _, e := d.Lookup(nobody, "x", &a); e != syscall.EACCES {
			t.Errorf("Check caller looks up in another's 0700 dir: %v, want EACCES", e)
		}
		// Back to the process's credentials: root reads both and makes
		// files in the 0700 dir, as root.
		if got := threadCreds(t); got != before {
			t.Fatalf("thread credentials after Check operations:\n%s\nbefore:\n%s", got, before)
		}
		for _, n := range []layer.Node{theirs, roots} {
			if e := readAs(ctx, n); e != 0 {
				t.Errorf("root reads a 0600 file after a Check operation: %v", e)
			}
		}
		c, h, e := d.Create(ctx, fmt.Sprint("f", i), unix.O_WRONLY, 0o600, &a)
		if e != 0 {
			t.Fatalf("root creates in a 0700 dir after a Check operation: %v", e)
		}
		h.Release(ctx)
		c.Forget()
		if a.Uid != 0 || a.Gid != 0 {
			t.Errorf("root's file is %d:%d", a.Uid, a.Gid)
		}
	}
}

// Threads pass between goroutines: under load, Check operations of
// several users, FUSE callers' creates and root's operations interleave on
// shared threads, and each sees only its own credentials.
func TestCheckThreadsAreShared(t *testing.T) {
	needRoot(t)
	_, root := restoreTree(t)
	theirs, roots, d := lookup(t, root, "theirs"), lookup(t, root, "roots"), lookup(t, root, "d")
	open := lookup(t, root, "public") // a file, to stat
	rootDir := root
	var wg sync.WaitGroup
	errs := make(chan string, 100)
	report := func(f string, args ...any) {
		select {
		case errs <- fmt.Sprintf(f, args...):
		default:
		}
	}
	for g := 0; g < 4*runtime.GOMAXPROCS(0); g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var a layer.Attr
			for i := 0; i < 100; i++ {
				switch (g + i) % 4 {
				case 0, 1:
					u := checkUsers[(g+i)%2]
					if e := readAs(u.ctx(), theirs); e != syscall.EACCES {
						report("uid %d reads another's 0600 file: %v", u.uid, e)
					}
					if e := open.Getattr(u.ctx(), nil, &a); e != 0 {
						report("uid %d stats: %v", u.uid, e)
					}
				case 2:
					for _, n := range []layer.Node{theirs, roots} {
						if e := readAs(ctx, n); e != 0 {
							report("root reads a 0600 file: %v", e)
						}
					}
					name := fmt.Sprintf("r%d-%d", g, i)
					c, e := d.Mkdir(ctx, name, 0o700, &a)
					if e != 0 {
						report("root mkdir in a 0700 dir: %v", e)
						continue
					}
					c.Forget()
					if a.Uid != 0 || a.Gid != 0 {
						report("root's dir is %d:%d", a.Uid, a.Gid)
					}
				case 3:
					fuse := layer.WithCaller(ctx, layer.Caller{Uid: 1000, Gid: 1000})
					name := fmt.Sprintf("u%d-%d", g, i)
					c, e := rootDir.Mkdir(fuse, name, 0o700, &a)
					if e != 0 {
						report("FUSE caller's mkdir: %v", e)
						continue
					}
					c.Forget()
					if a.Uid != 1000 || a.Gid != 1000 {
						report("FUSE caller's dir is %d:%d", a.Uid, a.Gid)
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
}

// Paths under /proc/self/fd, which whole-node operations go through, are
// open to a thread of ours with another fsuid and no capabilities (the
// same thread group may), and then check the target inode as the caller.
func TestCheckProcSelfFd(t *testing.T) {
	needRoot(t)
	_, root := restoreTree(t)
	hfs := root.(*node).fs
	public, theirs := lookup(t, root, "public").(*node), lookup(t, root, "theirs").(*node)
	nobody := checkUsers[1].ctx()
	err := hfs.checked(nobody, func() error {
		u, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, ^uintptr(0), 0, 0)
		if u != 65534 {
			t.Errorf("fsuid %d inside checked, want 65534", u)
		}
		c := threadCreds(t)
		if credLine(c, "CapEff:") != "0000000000000000" || credLine(c, "Groups:") != "" || credLine(c, "Gid:") != "0\t0\t0\t65534" {
			t.Errorf("inside checked:\n%s", c)
		}
		if _, err := os.Readlink(procPath(public.fd)); err != nil {
			t.Errorf("readlink of /proc/self/fd/N: %v", err)
		}
		fd, err := unix.Open(procPath(public.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Errorf("open of a 0644 file through /proc/self/fd: %v", err)
		} else {
			unix.Close(fd)
		}
		if _, err := unix.Open(procPath(theirs.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0); err != syscall.EACCES {
			t.Errorf("open of another's 0600 file through /proc/self/fd: %v, want EACCES", err)
		}
		var st unix.Stat_t
		if err := unix.Stat(procPath(theirs.fd), &st); err != nil || st.Uid != otherUid {
			t.Errorf("stat through /proc/self/fd: %v uid %d", err, st.Uid)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Not running as root, shale cannot switch: with Check it serves its own
// user only, and everyone else gets EACCES on every operation.
func TestCheckNotRoot(t *testing.T) {
	_, root := restoreTree(t)
	hfs := root.(*node).fs
	hfs.asRoot, hfs.euid = false, otherUid // as if run by otherUid
	self := layer.WithCaller(ctx, layer.Caller{Uid: otherUid, Gid: otherUid, Supp: []uint32{}, Check: true})
	stranger := checkUsers[0].ctx()
	var a layer.Attr
	n, e := root.Lookup(self, "public", &a)
	if e != 0 {
		t.Fatalf("Lookup by the server's own user: %v", e)
	}
	defer n.Forget()
	h, e := n.Open(self, unix.O_RDWR)
	if e != 0 {
		t.Fatalf("Open by the server's own user: %v", e)
	}
	defer h.Release(ctx)
	ops := map[string]func() layer.Errno{
		"Lookup":  func() layer.Errno { _, e := root.Lookup(stranger, "public", &a); return e },
		"Getattr": func() layer.Errno { return n.Getattr(stranger, nil, &a) },
		"Open":    func() layer.Errno { _, e := n.Open(stranger, unix.O_RDONLY); return e },
		"OpenDir": func() layer.Errno { _, e := root.OpenDir(stranger); return e },
		"Read":    func() layer.Errno { _, e := h.Read(stranger, make([]byte, 4), 0); return e },
		"Write":   func() layer.Errno { _, e := h.Write(stranger, []byte("x"), 0); return e },
		"Fsync":   func() layer.Errno { return h.Fsync(stranger, false) },
		"Mkdir":   func() layer.Errno { _, e := root.Mkdir(stranger, "x", 0o755, &a); return e },
		"Unlink":  func() layer.Errno { return root.Unlink(stranger, "public") },
		"Setattr": func() layer.Errno {
			return n.Setattr(stranger, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o600}, &a)
		},
		"Listxattr": func() layer.Errno { _, e := n.Listxattr(stranger, make([]byte, 64)); return e },
		"Statfs":    func() layer.Errno { return root.Statfs(stranger, &layer.Statfs{}) },
	}
	for name, op := range ops {
		if e := op(); e != syscall.EACCES {
			t.Errorf("%s by another user: %v, want EACCES", name, e)
		}
	}
	if _, e := h.Read(self, make([]byte, 4), 0); e != 0 {
		t.Errorf("Read by the server's own user: %v", e)
	}
}

// The cost of the switch, per operation: a Getattr as root, as a FUSE
// caller (no switch) and as Check callers (switch and back; root keeps its
// capabilities, and groups equal to the process's are not set).
func BenchmarkCheckGetattr(b *testing.B) {
	needRoot(b)
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), nil, 0o644)
	root, err := New(stack.New(stack.Options{}), dir)
	if err != nil {
		b.Fatal(err)
	}
	defer root.Forget()
	var a layer.Attr
	n, e := root.Lookup(ctx, "f", &a)
	if e != 0 {
		b.Fatal(e)
	}
	defer n.Forget()
	for _, bc := range []struct {
		name string
		ctx  context.Context
	}{
		{"root", ctx},
		{"fuse", layer.WithCaller(ctx, layer.Caller{Uid: 1000, Gid: 1000})},
		{"check1000", checkUsers[0].ctx()},  // groups to set
		{"check65534", checkUsers[1].ctx()}, // the process's (no) groups

		{"check0", layer.WithCaller(ctx, layer.Caller{Supp: []uint32{}, Check: true})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if e := n.Getattr(bc.ctx, nil, &a); e != 0 {
					b.Fatal(e)
				}
			}
		})
	}
}
