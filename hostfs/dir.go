package hostfs

import (
	"bytes"
	"context"
	"encoding/binary"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

func (n *node) OpenDir(ctx context.Context) (layer.DirStream, layer.Errno) {
	nfd, e := n.use()
	if e != 0 {
		return nil, e
	}
	defer n.done()
	var fd int
	err := n.fs.checked(ctx, func() (err error) {
		fd, err = unix.Open(procPath(nfd), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return nil, errno(err)
	}
	return &dir{fs: n.fs, fd: fd, buf: make([]byte, 32<<10)}, 0
}

// dir reads a host directory with getdents64. Offsets are the host file
// system's d_off cookies, which ext4, xfs and btrfs keep stable while the
// directory changes.
type dir struct {
	fs       *FS // to read as the caller under Check
	fd       int
	buf      []byte
	pos, end int
}

func (d *dir) Next(ctx context.Context) (layer.DirEntry, bool, layer.Errno) {
	if d.pos >= d.end {
		var k int
		err := d.fs.checked(ctx, func() (err error) {
			k, err = unix.Getdents(d.fd, d.buf)
			return err
		})
		if err != nil {
			return layer.DirEntry{}, false, errno(err)
		}
		if k == 0 {
			return layer.DirEntry{}, false, 0
		}
		d.pos, d.end = 0, k
	}
	// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
	rec := d.buf[d.pos:d.end]
	reclen := int(binary.NativeEndian.Uint16(rec[16:]))
	d.pos += reclen
	name := rec[19:reclen]
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	return layer.DirEntry{
		Name: string(name),
		Ino:  binary.NativeEndian.Uint64(rec[0:]),
		Off:  binary.NativeEndian.Uint64(rec[8:]),
		Type: uint32(rec[18]) << 12, // DT_* is S_IFMT >> 12
	}, true, 0
}

// SeeksAnywhere: d_off cookies (above) hold across streams.
func (n *node) SeeksAnywhere() bool { return true }

func (d *dir) Seek(ctx context.Context, off uint64) layer.Errno {
	d.pos, d.end = 0, 0
	return errno(d.fs.checked(ctx, func() error {
		_, err := unix.Seek(d.fd, int64(off), 0)
		return err
	}))
}

func (d *dir) Fsync(ctx context.Context, datasync bool) layer.Errno {
	return errno(d.fs.checked(ctx, func() error { return unix.Fsync(d.fd) }))
}

func (d *dir) Close() { unix.Close(d.fd) }
