package hostfs

import (
	"context"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// Attributes: stat and the changes of setattr.

func (n *node) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	if f, ok := h.(*file); ok {
		return errno(n.fs.checked(ctx, func() error { return statxAttr(f.fd, out) }))
	}
	fd, e := n.use()
	if e != 0 {
		return e
	}
	defer n.done()
	return errno(n.fs.checked(ctx, func() error { return statxAttr(fd, out) }))
}

// statxAttr fills out from fd.
func statxAttr(fd int, out *layer.Attr) error {
	var st unix.Statx_t
	if err := statx(fd, &st); err != nil {
		return err
	}
	out.FromStatx(&st)
	return nil
}

func (n *node) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	fd, e := n.use()
	if e != 0 {
		return e
	}
	defer n.done()
	if in.Valid&layer.SetKillSuidgid != 0 && checking(ctx) {
		if e := n.killPriv(ctx, fd, in.Mode); e != 0 {
			return e
		}
		rest := *in
		rest.Valid &^= layer.SetMode | layer.SetKillSuidgid
		in = &rest
	}
	if err := n.fs.checked(ctx, func() error { return setattr(fd, h, in) }); err != nil {
		return errno(err)
	}
	if f, ok := h.(*file); ok {
		fd = f.fd
	}
	kind := layer.Attrs
	if in.Valid&layer.SetSize != 0 {
		kind = layer.Data
	}
	n.fs.raise(ctx, kind, n.token, "")
	return errno(statxAttr(fd, out))
}

// killPriv sets mode, the file's without some of its setuid and setgid
// bits (layer.SetKillSuidgid), if the caller may write the file: as the
// kernel clears them at such a caller's write, whoever owns the file.
func (n *node) killPriv(ctx context.Context, fd int, mode uint32) layer.Errno {
	err := n.fs.checked(ctx, func() error {
		return unix.Faccessat2(unix.AT_FDCWD, procPath(fd), unix.W_OK, unix.AT_EACCESS)
	})
	if err != nil {
		return errno(err)
	}
	var st unix.Statx_t
	if err := statx(fd, &st); err != nil {
		return errno(err)
	}
	cur := uint32(st.Mode) & 0o7777
	if cur&^mode&^(unix.S_ISUID|unix.S_ISGID) != 0 || mode&^cur != 0 {
		return syscall.EPERM // the mode changed since: more than that
	}
	return errno(unix.Chmod(procPath(fd), mode&0o7777))
}

// setattr applies in to the node fd holds, or to its open file h.
func setattr(fd int, h layer.Handle, in *layer.SetAttr) error {
	if in.Valid&layer.SetMode != 0 {
		if err := unix.Chmod(procPath(fd), in.Mode&07777); err != nil {
			return err
		}
	}
	if in.Valid&(layer.SetUid|layer.SetGid) != 0 {
		uid, gid := -1, -1
		if in.Valid&layer.SetUid != 0 {
			uid = int(in.Uid)
		}
		if in.Valid&layer.SetGid != 0 {
			gid = int(in.Gid)
		}
		if err := unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	if in.Valid&layer.SetSize != 0 {
		var err error
		if f, ok := h.(*file); ok {
			err = unix.Ftruncate(f.fd, int64(in.Size))
		} else {
			err = unix.Truncate(procPath(fd), int64(in.Size))
		}
		if err != nil {
			return err
		}
	}
	if in.Valid&(layer.SetAtime|layer.SetMtime|layer.SetAtimeNow|layer.SetMtimeNow) != 0 {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		switch {
		case in.Valid&layer.SetAtimeNow != 0:
			ts[0].Nsec = unix.UTIME_NOW
		case in.Valid&layer.SetAtime != 0:
			ts[0] = unix.NsecToTimespec(in.Atime.UnixNano())
		}
		switch {
		case in.Valid&layer.SetMtimeNow != 0:
			ts[1].Nsec = unix.UTIME_NOW
		case in.Valid&layer.SetMtime != 0:
			ts[1] = unix.NsecToTimespec(in.Mtime.UnixNano())
		}
		return unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}
