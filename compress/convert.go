package compress

import (
	"context"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// Progress is what Convert has done so far, of the plain files it found.
type Progress struct {
	Files, TotalFiles int
	Bytes, TotalBytes int64 // plain bytes converted, of all to convert
	Stored            int64 // what the converted files take now
	Path              string
	Skipped           int    // hard-linked files, left plain
	SkipReason        string // why the last file was skipped
}

// tmpSuffix names the temporary a file is converted into, beside it. A
// leftover of an interrupted run is removed by the next.
const tmpSuffix = ".shale-convert.tmp"

// Convert compresses, in place, every plain regular file under the local
// directory dir: each is written in the layer's format to a temporary
// beside it, synced, given the file's owner, mode, times and extended
// attributes, and renamed over it. An interruption leaves every file
// whole, plain or compressed; running again finishes the work (files
// already in the layer's format, and empty ones, are left as they are).
// Hard-linked files are left plain: the rename would split their links.
// dir must not be in use (mounted or changed) meanwhile; a file that
// changes while it is converted is left plain, and Convert says so.
func Convert(ctx context.Context, dir string, report func(Progress)) error {
	var todo []string
	var p Progress
	err := filepath.WalkDir(dir, func(path string, d iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasSuffix(path, tmpSuffix) {
			return os.Remove(path)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		plain, size, err := isPlain(path)
		if err != nil || !plain {
			return err
		}
		todo = append(todo, path)
		p.TotalFiles++
		p.TotalBytes += size
		return nil
	})
	if err != nil {
		return fmt.Errorf("convert %s: %v", dir, err)
	}
	lower, err := hostfs.New(stack.New(stack.Options{CoherenceOff: true}), dir)
	if err != nil {
		return fmt.Errorf("convert %s: %v", dir, err)
	}
	defer lower.Forget()
	root := New(lower)
	for _, path := range todo {
		rel, _ := filepath.Rel(dir, path)
		p.Path, p.SkipReason = rel, ""
		before, stored, err := convertFile(ctx, root, rel)
		switch {
		case err == errSkip:
			p.Skipped++
			p.SkipReason = "hard-linked or changed meanwhile: left plain"
		case err != nil:
			return fmt.Errorf("convert %s: %v; it is left as it was, and running convert again goes on", path, err)
		default:
			p.Files++
			p.Bytes += before
			p.Stored += stored
		}
		report(p)
	}
	return nil
}

var errSkip = fmt.Errorf("skipped")

// isPlain tells whether the file at path is non-empty and not in the
// layer's format.
func isPlain(path string) (bool, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return false, 0, err
	}
	b := make([]byte, headerSize)
	k, _ := f.ReadAt(b, 0)
	_, err = decodeHeader(b[:k])
	return err == errPlain, fi.Size(), nil
}

// walk finds the directory node of rel's parent, through the layer.
func walk(ctx context.Context, root layer.Node, rel string) (layer.Node, func(), layer.Errno) {
	dir, forget := root, []layer.Node{}
	done := func() {
		for _, n := range forget {
			n.Forget()
		}
	}
	if d := filepath.Dir(rel); d != "." {
		for _, name := range strings.Split(d, "/") {
			var a layer.Attr
			n, e := dir.Lookup(ctx, name, &a)
			if e != 0 {
				done()
				return nil, nil, e
			}
			forget = append(forget, n)
			dir = n
		}
	}
	return dir, done, 0
}

// convertFile converts the plain file rel and returns its plain and
// stored sizes.
func convertFile(ctx context.Context, root layer.Node, rel string) (int64, int64, error) {
	dir, done, e := walk(ctx, root, rel)
	if e != 0 {
		return 0, 0, e
	}
	defer done()
	name := filepath.Base(rel)
	low := dir.(*node).Lower
	var a layer.Attr
	src, e := low.Lookup(ctx, name, &a)
	if e != 0 {
		return 0, 0, e
	}
	defer src.Forget()
	if a.Nlink > 1 {
		return 0, 0, errSkip
	}
	tmp := "." + name + tmpSuffix
	if len(tmp) > 255 {
		tmp = fmt.Sprintf(".%x%s", a.Ino, tmpSuffix)
	}
	var ta layer.Attr
	tn, th, e := dir.Create(ctx, tmp, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL, 0o600, &ta)
	if e != 0 {
		return 0, 0, e
	}
	defer tn.Forget()
	keep := false
	defer func() {
		if !keep {
			dir.Unlink(ctx, tmp)
		}
	}()
	e = copyData(ctx, src, th)
	if e == 0 {
		e = copyAttrs(ctx, src, tn.(*node).Lower, &a)
	}
	if e == 0 {
		e = th.Fsync(ctx, false)
	}
	if re := th.Release(ctx); e == 0 {
		e = re
	}
	if e != 0 {
		return 0, 0, e
	}
	// Unchanged since it was read? Otherwise a write made meanwhile
	// would be lost.
	var now layer.Attr
	if e := src.Getattr(ctx, nil, &now); e != 0 {
		return 0, 0, e
	}
	if now.Size != a.Size || !now.Mtime.Equal(a.Mtime) || !now.Ctime.Equal(a.Ctime) || now.Nlink > 1 {
		return 0, 0, errSkip
	}
	if e := low.Rename(ctx, tmp, low, name, 0); e != 0 {
		return 0, 0, e
	}
	keep = true
	d, e := low.OpenDir(ctx)
	if e == 0 {
		e = d.Fsync(ctx, false)
		d.Close()
	}
	var sa layer.Attr
	tn.(*node).Lower.Getattr(ctx, nil, &sa)
	if e != 0 {
		return 0, 0, e
	}
	return int64(a.Size), int64(sa.Size), nil
}

// copyData copies the plain file src through h, a handle of the layer.
func copyData(ctx context.Context, src layer.Node, h layer.Handle) layer.Errno {
	sh, e := src.Open(ctx, syscall.O_RDONLY|syscall.O_NOATIME)
	if e != 0 {
		return e
	}
	defer sh.Release(ctx)
	buf := make([]byte, 16*blockSize) // whole blocks: each stored once
	for off := int64(0); ; {
		k, e := readFull(ctx, lowerFile{src, sh}, buf, off)
		if e != 0 {
			return e
		}
		if k == 0 {
			return 0
		}
		if w, e := h.Write(ctx, buf[:k], off); e != 0 || w != k {
			return orEIO(e)
		}
		off += int64(k)
	}
}

func orEIO(e layer.Errno) layer.Errno {
	if e != 0 {
		return e
	}
	return syscall.EIO
}

// copyAttrs gives dst src's owner, mode, times and extended attributes
// (a: src's attributes).
func copyAttrs(ctx context.Context, src, dst layer.Node, a *layer.Attr) layer.Errno {
	size, e := src.Listxattr(ctx, nil)
	if e != 0 && e != syscall.EOPNOTSUPP {
		return e
	}
	if size > 0 {
		list := make([]byte, size)
		k, e := src.Listxattr(ctx, list)
		if e != 0 {
			return e
		}
		for _, x := range strings.Split(strings.TrimRight(string(list[:k]), "\x00"), "\x00") {
			vs, e := src.Getxattr(ctx, x, nil)
			if e != 0 {
				return e
			}
			v := make([]byte, vs)
			vk, e := src.Getxattr(ctx, x, v)
			if e == 0 {
				e = dst.Setxattr(ctx, x, v[:vk], 0)
			}
			if e != 0 {
				return e
			}
		}
	}
	var out layer.Attr
	return dst.Setattr(ctx, nil, &layer.SetAttr{
		Valid: layer.SetUid | layer.SetGid | layer.SetMode | layer.SetAtime | layer.SetMtime,
		Uid:   a.Uid, Gid: a.Gid, Mode: a.Mode & 0o7777, Atime: a.Atime, Mtime: a.Mtime,
	}, &out)
}
