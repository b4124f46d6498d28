package layer

import (
	"context"
	"io/fs"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Whole small files in a directory Node, for code that keeps state of its
// own in the tree it serves (crypt's shale.conf), whatever the backend:
// the counterparts of os.ReadFile, an atomic os.WriteFile and a listing.
// Errors are *fs.PathError holding the Errno and naming the file within
// the directory, so errors.Is(err, fs.ErrNotExist) and the like work.
// Every node looked up or made on the way is forgotten before return.

// readHint bounds the buffer ReadFile sizes from the file's attributes, so
// that a damaged or hostile size cannot make it allocate much.
const readHint = 1 << 20

// ReadFile returns the contents of the file name in dir.
func ReadFile(ctx context.Context, dir Node, name string) ([]byte, error) {
	var a Attr
	n, e := dir.Lookup(ctx, name, &a)
	if e != 0 {
		return nil, &fs.PathError{Op: "open", Path: name, Err: e}
	}
	defer n.Forget()
	h, e := n.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		return nil, &fs.PathError{Op: "open", Path: name, Err: e}
	}
	defer h.Release(ctx)
	// One byte beyond the size, so that a file of the size it had is read
	// with no growth; reads may be short (a 9P message), so loop to EOF.
	data := make([]byte, 0, min(a.Size, readHint)+1)
	for {
		if len(data) == cap(data) {
			data = slices.Grow(data, 1)
		}
		k, e := h.Read(ctx, data[len(data):cap(data)], int64(len(data)))
		if e != 0 {
			return nil, &fs.PathError{Op: "read", Path: name, Err: e}
		}
		if k == 0 {
			return data, nil
		}
		data = data[:len(data)+k]
	}
}

// WriteFileAtomic makes the file name in dir hold data, so that a crash
// leaves either the old state or the new, never a partial file: data goes
// into a temporary file beside name, which is synced and then renamed over
// name (replace) or linked to name (!replace: it fails with EEXIST if name
// exists; where Link is unsupported, a rename with RENAME_NOREPLACE does
// the same), and the directory is synced. mode is as for Create (the
// umask of ctx's caller applies). The temporary is removed on failure.
func WriteFileAtomic(ctx context.Context, dir Node, name string, data []byte, mode uint32, replace bool) error {
	tmp, n, err := writeTemp(ctx, dir, name, data, mode)
	if err != nil {
		return err
	}
	defer n.Forget()
	op, e, kept := "rename", OK, true // kept: the temporary is still there
	if replace {
		e = dir.Rename(ctx, tmp, dir, name, 0)
		kept = e != 0
	} else {
		op = "link"
		var a Attr
		var l Node
		if l, e = dir.Link(ctx, n, name, &a); e == 0 {
			l.Forget()
		} else if linkUnsupported(e) {
			e = dir.Rename(ctx, tmp, dir, name, unix.RENAME_NOREPLACE)
			kept = e != 0
		}
	}
	if kept {
		dir.Unlink(ctx, tmp)
	}
	if e != 0 {
		return &fs.PathError{Op: op, Path: name, Err: e}
	}
	d, e := dir.OpenDir(ctx)
	if e == 0 {
		e = d.Fsync(ctx, false)
		d.Close()
	}
	if e != 0 {
		return &fs.PathError{Op: "fsync", Path: ".", Err: e}
	}
	return nil
}

// linkUnsupported tells whether Link failed because the file system makes
// no hard links (EPERM is link(2)'s word for that), not because of name.
func linkUnsupported(e Errno) bool {
	return e == syscall.EPERM || e == syscall.EOPNOTSUPP || e == syscall.ENOSYS
}

// writeTemp writes data, synced, to a new file beside name and returns its
// name and node; on failure it leaves nothing behind.
func writeTemp(ctx context.Context, dir Node, name string, data []byte, mode uint32) (string, Node, error) {
	var (
		tmp string
		n   Node
		h   Handle
		e   Errno
	)
	// A random part, so that writers do not collide with one another or
	// with a crashed one's leftover; a leading '.' keeps leftovers out of
	// views that hide dot files and out of the way of names that decode.
	for range 100 {
		tmp = "." + name + "." + strconv.FormatUint(uint64(rand.Uint32()), 10) + ".tmp"
		var a Attr
		n, h, e = dir.Create(ctx, tmp, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, mode, &a)
		if e != syscall.EEXIST {
			break
		}
	}
	if e != 0 {
		return "", nil, &fs.PathError{Op: "create", Path: tmp, Err: e}
	}
	op, e := "write", writeAll(ctx, h, data)
	if e == 0 {
		op, e = "fsync", h.Fsync(ctx, false)
	}
	if re := h.Release(ctx); e == 0 {
		op, e = "close", re
	}
	if e != 0 {
		n.Forget()
		dir.Unlink(ctx, tmp)
		return "", nil, &fs.PathError{Op: op, Path: tmp, Err: e}
	}
	return tmp, n, nil
}

// writeAll writes data at the start of h, however short its writes are.
func writeAll(ctx context.Context, h Handle, data []byte) Errno {
	for off := 0; off < len(data); {
		k, e := h.Write(ctx, data[off:], int64(off))
		if e != 0 {
			return e
		}
		if k <= 0 {
			return syscall.EIO // no progress: it would never end
		}
		off += k
	}
	return OK
}

// ReadDirNames returns the names in dir but "." and "..", sorted.
func ReadDirNames(ctx context.Context, dir Node) ([]string, error) {
	d, e := dir.OpenDir(ctx)
	if e != 0 {
		return nil, &fs.PathError{Op: "open", Path: ".", Err: e}
	}
	defer d.Close()
	var names []string
	for {
		ent, ok, e := d.Next(ctx)
		if e != 0 {
			return nil, &fs.PathError{Op: "readdirent", Path: ".", Err: e}
		}
		if !ok {
			slices.Sort(names)
			return names, nil
		}
		if ent.Name != "." && ent.Name != ".." {
			names = append(names, ent.Name)
		}
	}
}

// BlockFlags adapts open flags for the lower file of a layer that stores
// file data in blocks of its own (wrap's BlockCodec, compress): blocks are
// read, modified and written whole, so a writer must be able to read, and
// reading to modify must not count as an access; appends are placed by
// the layer, not by the lower file system; and O_DIRECT stays above,
// where the kernel honours it: the layer's lower reads and writes (a
// header, blocks grown by an overhead) are never aligned as direct I/O
// requires (the lower file system would refuse them with EINVAL).
func BlockFlags(flags uint32) uint32 {
	if flags&syscall.O_ACCMODE == syscall.O_WRONLY {
		flags = flags&^syscall.O_ACCMODE | syscall.O_RDWR | syscall.O_NOATIME
	}
	return flags &^ (syscall.O_APPEND | syscall.O_DIRECT)
}
