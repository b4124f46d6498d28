package crypt

import (
	"context"
	"crypto/rand"
	"fmt"
	"syscall"

	"github.com/shalefs/shale/layer"
)

// Every lower directory holds its ID, 16 random bytes, in a read-only file
// named dirIDName, made when the layer makes the directory (the root's
// when it is first opened through the layer). The ID is the associated
// data of the directory's names. It is not secret: changing it only makes
// the directory's names fail to decode, never decode to other names. The
// leading '.' can never be produced by EncodeName, so the file is hidden
// from the view above.
const (
	dirIDName = ".shale.dirid"
	dirIDSize = 16
)

// DirID reads the ID of a lower directory.
func (l *Layer) DirID(ctx context.Context, lowerDir layer.Node) ([]byte, error) {
	var a layer.Attr
	n, e := lowerDir.Lookup(ctx, dirIDName, &a)
	if e != 0 {
		return nil, fmt.Errorf("directory ID %s: %w", dirIDName, e)
	}
	defer n.Forget()
	if a.Mode&syscall.S_IFMT != syscall.S_IFREG || a.Size != dirIDSize {
		return nil, fmt.Errorf("directory ID %s is not a %d-byte file (mode %#o, %d bytes)", dirIDName, dirIDSize, a.Mode, a.Size)
	}
	h, e := n.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		return nil, fmt.Errorf("open directory ID %s: %w", dirIDName, e)
	}
	defer h.Release(ctx)
	// Read one byte more than an ID, to notice a file that grew since the
	// Lookup.
	id := make([]byte, dirIDSize+1)
	got := 0
	for got < len(id) {
		m, e := h.Read(ctx, id[got:], int64(got))
		if e != 0 {
			return nil, fmt.Errorf("read directory ID %s: %w", dirIDName, e)
		}
		if m == 0 {
			break
		}
		got += m
	}
	if got != dirIDSize {
		return nil, fmt.Errorf("directory ID %s holds %d bytes, want %d", dirIDName, got, dirIDSize)
	}
	return id[:dirIDSize], nil
}

// InitDir gives a new lower directory a fresh random ID. It never replaces
// an existing ID file (O_EXCL): that would hide every name in the directory.
func (l *Layer) InitDir(ctx context.Context, lowerDir layer.Node) error {
	var a layer.Attr
	n, h, e := lowerDir.Create(ctx, dirIDName, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_EXCL, 0o444, &a)
	if e != 0 {
		return fmt.Errorf("create directory ID %s: %w", dirIDName, e)
	}
	defer n.Forget()
	id := make([]byte, dirIDSize)
	rand.Read(id) // never fails (crypto/rand panics on a broken kernel)
	m, e := h.Write(ctx, id, 0)
	if e == 0 && m != dirIDSize {
		e = syscall.EIO
	}
	if e == 0 {
		e = h.Fsync(ctx, false)
	}
	if re := h.Release(ctx); e == 0 {
		e = re
	}
	if e != 0 {
		// Leave no partial ID behind to make the next attempt fail.
		lowerDir.Unlink(ctx, dirIDName)
		return fmt.Errorf("write directory ID %s: %w", dirIDName, e)
	}
	return nil
}
