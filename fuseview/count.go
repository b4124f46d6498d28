package fuseview

import (
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// counting counts every request a view's kernel sends, by opcode, with
// the time spent answering it (Counters). It is the outermost
// RawFileSystem: time.Now is evaluated before the request is served, as
// Go evaluates calls left to right. A READ's time ends when its
// ReadResult is made; the bytes of a host file are copied after.
type counting struct {
	fuse.RawFileSystem
	c      *Counters
	denied func(op string, uid uint32) // Options.Denied
}

// done counts a request of o from the caller of h (nil for those without
// one), begun at start and answered with st, and passes st on.
func (r *counting) done(o op, h *fuse.InHeader, start time.Time, st fuse.Status) fuse.Status {
	r.c.done(o, start, st)
	if (st == fuse.EACCES || st == fuse.EPERM) && r.denied != nil && h != nil {
		r.denied(opNames[o], h.Caller.Uid)
	}
	return st
}

// The FUSE opcodes counted, named as the kernel's headers name them
// (RENAME2 is counted as RENAME, BATCH_FORGET as a FORGET per inode).
type op uint8

const (
	opLookup op = iota
	opForget
	opGetattr
	opSetattr
	opMknod
	opMkdir
	opUnlink
	opRmdir
	opRename
	opLink
	opSymlink
	opReadlink
	opAccess
	opGetxattr
	opListxattr
	opSetxattr
	opRemovexattr
	opCreate
	opTmpfile
	opOpen
	opRead
	opLseek
	opGetlk
	opSetlk
	opSetlkw
	opRelease
	opWrite
	opCopyFileRange
	opIoctl
	opFlush
	opFsync
	opFallocate
	opOpendir
	opReaddir
	opReaddirplus
	opReleasedir
	opFsyncdir
	opStatfs
	opStatx
	nOps
)

var opNames = [nOps]string{"LOOKUP", "FORGET", "GETATTR", "SETATTR", "MKNOD", "MKDIR", "UNLINK", "RMDIR",
	"RENAME", "LINK", "SYMLINK", "READLINK", "ACCESS", "GETXATTR", "LISTXATTR", "SETXATTR", "REMOVEXATTR",
	"CREATE", "TMPFILE", "OPEN", "READ", "LSEEK", "GETLK", "SETLK", "SETLKW", "RELEASE", "WRITE",
	"COPY_FILE_RANGE", "IOCTL", "FLUSH", "FSYNC", "FALLOCATE", "OPENDIR", "READDIR", "READDIRPLUS",
	"RELEASEDIR", "FSYNCDIR", "STATFS", "STATX"}

func (r *counting) Lookup(cancel <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return r.done(opLookup, h, time.Now(), r.RawFileSystem.Lookup(cancel, h, name, out))
}

func (r *counting) Forget(nodeid, nlookup uint64) {
	t := time.Now()
	r.RawFileSystem.Forget(nodeid, nlookup)
	r.done(opForget, nil, t, fuse.OK)
}

func (r *counting) GetAttr(cancel <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	return r.done(opGetattr, &in.InHeader, time.Now(), r.RawFileSystem.GetAttr(cancel, in, out))
}

func (r *counting) SetAttr(cancel <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return r.done(opSetattr, &in.InHeader, time.Now(), r.RawFileSystem.SetAttr(cancel, in, out))
}

func (r *counting) Mknod(cancel <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.done(opMknod, &in.InHeader, time.Now(), r.RawFileSystem.Mknod(cancel, in, name, out))
}

func (r *counting) Mkdir(cancel <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.done(opMkdir, &in.InHeader, time.Now(), r.RawFileSystem.Mkdir(cancel, in, name, out))
}

func (r *counting) Unlink(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return r.done(opUnlink, h, time.Now(), r.RawFileSystem.Unlink(cancel, h, name))
}

func (r *counting) Rmdir(cancel <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return r.done(opRmdir, h, time.Now(), r.RawFileSystem.Rmdir(cancel, h, name))
}

func (r *counting) Rename(cancel <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return r.done(opRename, &in.InHeader, time.Now(), r.RawFileSystem.Rename(cancel, in, oldName, newName))
}

func (r *counting) Link(cancel <-chan struct{}, in *fuse.LinkIn, name string, out *fuse.EntryOut) fuse.Status {
	return r.done(opLink, &in.InHeader, time.Now(), r.RawFileSystem.Link(cancel, in, name, out))
}

func (r *counting) Symlink(cancel <-chan struct{}, h *fuse.InHeader, to, name string, out *fuse.EntryOut) fuse.Status {
	return r.done(opSymlink, h, time.Now(), r.RawFileSystem.Symlink(cancel, h, to, name, out))
}

func (r *counting) Readlink(cancel <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t := time.Now()
	b, st := r.RawFileSystem.Readlink(cancel, h)
	return b, r.done(opReadlink, h, t, st)
}

func (r *counting) Access(cancel <-chan struct{}, in *fuse.AccessIn) fuse.Status {
	return r.done(opAccess, &in.InHeader, time.Now(), r.RawFileSystem.Access(cancel, in))
}

func (r *counting) GetXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.GetXAttr(cancel, h, attr, dest)
	return n, r.done(opGetxattr, h, t, st)
}

func (r *counting) ListXAttr(cancel <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.ListXAttr(cancel, h, dest)
	return n, r.done(opListxattr, h, t, st)
}

func (r *counting) SetXAttr(cancel <-chan struct{}, in *fuse.SetXAttrIn, attr string, data []byte) fuse.Status {
	return r.done(opSetxattr, &in.InHeader, time.Now(), r.RawFileSystem.SetXAttr(cancel, in, attr, data))
}

func (r *counting) RemoveXAttr(cancel <-chan struct{}, h *fuse.InHeader, attr string) fuse.Status {
	return r.done(opRemovexattr, h, time.Now(), r.RawFileSystem.RemoveXAttr(cancel, h, attr))
}

func (r *counting) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return r.done(opCreate, &in.InHeader, time.Now(), r.RawFileSystem.Create(cancel, in, name, out))
}

func (r *counting) Tmpfile(cancel <-chan struct{}, in *fuse.CreateIn, out *fuse.CreateOut) fuse.Status {
	return r.done(opTmpfile, &in.InHeader, time.Now(), r.RawFileSystem.Tmpfile(cancel, in, out))
}

func (r *counting) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return r.done(opOpen, &in.InHeader, time.Now(), r.RawFileSystem.Open(cancel, in, out))
}

func (r *counting) Read(cancel <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	t := time.Now()
	res, st := r.RawFileSystem.Read(cancel, in, buf)
	return res, r.done(opRead, &in.InHeader, t, st)
}

func (r *counting) Lseek(cancel <-chan struct{}, in *fuse.LseekIn, out *fuse.LseekOut) fuse.Status {
	return r.done(opLseek, &in.InHeader, time.Now(), r.RawFileSystem.Lseek(cancel, in, out))
}

func (r *counting) GetLk(cancel <-chan struct{}, in *fuse.LkIn, out *fuse.LkOut) fuse.Status {
	return r.done(opGetlk, &in.InHeader, time.Now(), r.RawFileSystem.GetLk(cancel, in, out))
}

func (r *counting) SetLk(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return r.done(opSetlk, &in.InHeader, time.Now(), r.RawFileSystem.SetLk(cancel, in))
}

func (r *counting) SetLkw(cancel <-chan struct{}, in *fuse.LkIn) fuse.Status {
	return r.done(opSetlkw, &in.InHeader, time.Now(), r.RawFileSystem.SetLkw(cancel, in))
}

func (r *counting) Release(cancel <-chan struct{}, in *fuse.ReleaseIn) {
	t := time.Now()
	r.RawFileSystem.Release(cancel, in)
	r.done(opRelease, &in.InHeader, t, fuse.OK)
}

func (r *counting) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.Write(cancel, in, data)
	return n, r.done(opWrite, &in.InHeader, t, st)
}

// Writev is tried first; on ENOSYS go-fuse calls Write, which counts.
func (r *counting) Writev(cancel <-chan struct{}, in *fuse.WriteIn, data [][]byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.Writev(cancel, in, data)
	if st == fuse.ENOSYS {
		return n, st
	}
	return n, r.done(opWrite, &in.InHeader, t, st)
}

func (r *counting) CopyFileRange(cancel <-chan struct{}, in *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	t := time.Now()
	n, st := r.RawFileSystem.CopyFileRange(cancel, in)
	return n, r.done(opCopyFileRange, &in.InHeader, t, st)
}

func (r *counting) Ioctl(cancel <-chan struct{}, in *fuse.IoctlIn, inbuf []byte, out *fuse.IoctlOut, outbuf []byte) fuse.Status {
	return r.done(opIoctl, &in.InHeader, time.Now(), r.RawFileSystem.Ioctl(cancel, in, inbuf, out, outbuf))
}

func (r *counting) Flush(cancel <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return r.done(opFlush, &in.InHeader, time.Now(), r.RawFileSystem.Flush(cancel, in))
}

func (r *counting) Fsync(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return r.done(opFsync, &in.InHeader, time.Now(), r.RawFileSystem.Fsync(cancel, in))
}

func (r *counting) Fallocate(cancel <-chan struct{}, in *fuse.FallocateIn) fuse.Status {
	return r.done(opFallocate, &in.InHeader, time.Now(), r.RawFileSystem.Fallocate(cancel, in))
}

func (r *counting) OpenDir(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return r.done(opOpendir, &in.InHeader, time.Now(), r.RawFileSystem.OpenDir(cancel, in, out))
}

func (r *counting) ReadDir(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.done(opReaddir, &in.InHeader, time.Now(), r.RawFileSystem.ReadDir(cancel, in, out))
}

func (r *counting) ReadDirPlus(cancel <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return r.done(opReaddirplus, &in.InHeader, time.Now(), r.RawFileSystem.ReadDirPlus(cancel, in, out))
}

func (r *counting) ReleaseDir(in *fuse.ReleaseIn) {
	t := time.Now()
	r.RawFileSystem.ReleaseDir(in)
	r.done(opReleasedir, &in.InHeader, t, fuse.OK)
}

func (r *counting) FsyncDir(cancel <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return r.done(opFsyncdir, &in.InHeader, time.Now(), r.RawFileSystem.FsyncDir(cancel, in))
}

func (r *counting) StatFs(cancel <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	return r.done(opStatfs, h, time.Now(), r.RawFileSystem.StatFs(cancel, h, out))
}

func (r *counting) Statx(cancel <-chan struct{}, in *fuse.StatxIn, out *fuse.StatxOut) fuse.Status {
	return r.done(opStatx, &in.InHeader, time.Now(), r.RawFileSystem.Statx(cancel, in, out))
}
