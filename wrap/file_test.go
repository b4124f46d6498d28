package wrap

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// disk is a lower root with little room, for one file: its pages are
// allocated as tmpfs does, so a write stops at the first page it cannot
// get (short if it stored anything, else ENOSPC), fallocate gets all its
// pages or none, and truncating frees the pages past the new end. Past
// limit, the largest file size, writes stop and the rest fails with EFBIG.
type disk struct {
	layer.Node
	page  int64
	free  int            // pages left
	pages map[int64]bool // pages of the file that hold data
	limit int64
}

type diskFile struct {
	layer.Node
	d *disk
}

type diskHandle struct {
	layer.Handle
	d *disk
}

func (d *disk) Create(ctx context.Context, name string, flags, mode uint32, out *layer.Attr) (layer.Node, layer.Handle, layer.Errno) {
	c, h, e := d.Node.Create(ctx, name, flags, mode, out)
	if e != 0 {
		return nil, nil, e
	}
	return &diskFile{c, d}, &diskHandle{h, d}, 0
}

func (f *diskFile) Open(ctx context.Context, flags uint32) (layer.Handle, layer.Errno) {
	h, e := f.Node.Open(ctx, flags)
	if e != 0 {
		return nil, e
	}
	return &diskHandle{h, f.d}, 0
}

func unwrapDisk(h layer.Handle) layer.Handle {
	if dh, ok := h.(*diskHandle); ok {
		return dh.Handle
	}
	return h
}

func (f *diskFile) Getattr(ctx context.Context, h layer.Handle, out *layer.Attr) layer.Errno {
	return f.Node.Getattr(ctx, unwrapDisk(h), out)
}

func (f *diskFile) Setattr(ctx context.Context, h layer.Handle, in *layer.SetAttr, out *layer.Attr) layer.Errno {
	if in.Valid&layer.SetSize != 0 && int64(in.Size) > f.d.limit {
		return syscall.EFBIG
	}
	if e := f.Node.Setattr(ctx, unwrapDisk(h), in, out); e != 0 || in.Valid&layer.SetSize == 0 {
		return e
	}
	d := f.d
	for p := range d.pages {
		if p*d.page >= int64(in.Size) {
			delete(d.pages, p)
			d.free++
		}
	}
	return 0
}

func (h *diskHandle) Write(ctx context.Context, data []byte, off int64) (int, layer.Errno) {
	d := h.d
	if off >= d.limit {
		return 0, syscall.EFBIG
	}
	want, k := min(int64(len(data)), d.limit-off), int64(0)
	for k < want {
		p := (off + k) / d.page
		if !d.pages[p] {
			if d.free == 0 {
				break
			}
			d.free--
			d.pages[p] = true
		}
		k = min((p+1)*d.page-off, want)
	}
	if k == 0 {
		return 0, syscall.ENOSPC
	}
	return h.Handle.Write(ctx, data[:k], off)
}

func (h *diskHandle) Allocate(ctx context.Context, off, size int64, mode uint32) layer.Errno {
	d := h.d
	if off+size > d.limit {
		return syscall.EFBIG
	}
	var missing []int64
	for p := off / d.page; p*d.page < off+size; p++ {
		if !d.pages[p] {
			missing = append(missing, p)
		}
	}
	if len(missing) > d.free {
		return syscall.ENOSPC
	}
	if e := h.Handle.Allocate(ctx, off, size, mode); e != 0 {
		return e
	}
	for _, p := range missing {
		d.pages[p] = true
	}
	d.free -= len(missing)
	return 0
}

// Writes, truncates and fallocates on a nearly full lower file system, or
// near its largest file size, fail with its errno, or store only whole
// blocks and say so with a short count; either way the file is the model,
// block for block, and the lower file has the size the layout implies (no
// torn block, no size past the data). With FillHoles too, where a write
// past the end first fills the gap with blocks: one that then stores none
// of its data must leave the size as it was, as natively.
func TestFullDiskAgainstModel(t *testing.T) {
	t.Run("holes", func(t *testing.T) { fullDiskAgainstModel(t, false) })
	t.Run("fill-holes", func(t *testing.T) { fullDiskAgainstModel(t, true) })
}

func fullDiskAgainstModel(t *testing.T, fill bool) {
	dir := t.TempDir()
	st := stack.New(stack.Options{})
	lower, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lower.Forget)
	// Pages of 32 bytes straddle the 72-byte stored blocks, so writes stop
	// inside blocks.
	d := &disk{Node: lower, page: 32}
	upper, err := New(ctx, st, d, Hooks{Blocks: toy{}, Header: toy{}, FillHoles: fill})
	if err != nil {
		t.Fatal(err)
	}
	lay := &fs{bs: 64, ov: 8, hs: 8, blocks: toy{}}
	r := rand.New(rand.NewPCG(3, 4))
	failed, short := map[syscall.Errno]int{}, 0
	for round := 0; round < 30; round++ {
		// Round 0 has no room even for the header.
		d.free, d.pages, d.limit = round%10*2, map[int64]bool{}, int64(700+r.IntN(500))
		var a layer.Attr
		name := fmt.Sprintf("f%d", round)
		n, h, e := upper.Create(ctx, name, syscall.O_RDWR, 0o644, &a)
		if e != 0 {
			t.Fatal(e)
		}
		var model []byte
		for step := 0; step < 80; step++ {
			what := ""
			switch op := r.IntN(10); {
			case op < 6:
				off, data := r.IntN(700), make([]byte, 1+r.IntN(300))
				for i := range data {
					data[i] = byte(r.IntN(255) + 1)
				}
				what = fmt.Sprintf("write %d@%d", len(data), off)
				k, e := h.Write(ctx, data, int64(off))
				switch {
				case (e == syscall.ENOSPC || e == syscall.EFBIG) && k == 0:
					failed[e]++
				case e == 0 && k > 0 && k < len(data):
					short++
				case e != 0 || k != len(data):
					t.Fatalf("round %d step %d: %s: %d, %v; want a count, ENOSPC or EFBIG", round, step, what, k, e)
				}
				if k > 0 {
					model = append(model, make([]byte, max(0, off+k-len(model)))...)
					copy(model[off:], data[:k])
				}
			case op < 8:
				size := r.IntN(900)
				what = fmt.Sprintf("truncate %d", size)
				switch e := n.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)}, &a); e {
				case 0:
					model = append(model[:min(size, len(model))], make([]byte, max(0, size-len(model)))...)
				case syscall.ENOSPC, syscall.EFBIG:
					failed[e]++
				default:
					t.Fatalf("round %d step %d: %s: %v", round, step, what, e)
				}
			case op < 9:
				off, size := r.IntN(700), 1+r.IntN(200)
				what = fmt.Sprintf("fallocate %d@%d", size, off)
				switch e := h.Allocate(ctx, int64(off), int64(size), 0); e {
				case 0:
					model = append(model, make([]byte, max(0, off+size-len(model)))...)
				case syscall.ENOSPC, syscall.EFBIG:
					failed[e]++
				default:
					t.Fatalf("round %d step %d: %s: %v", round, step, what, e)
				}
			default:
				what = "room"
				d.free += r.IntN(8) // as if another file were deleted
			}
			if e := n.Getattr(ctx, h, &a); e != 0 || a.Size != uint64(len(model)) {
				t.Fatalf("round %d step %d: after %s: size %d, model %d (%v)", round, step, what, a.Size, len(model), e)
			}
			buf := make([]byte, len(model)+10)
			if k, e := h.Read(ctx, buf, 0); e != 0 || !bytes.Equal(buf[:k], model) {
				t.Fatalf("round %d step %d: after %s: read %d bytes, %v; differs from the model", round, step, what, k, e)
			}
			st, err := os.Stat(filepath.Join(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if want := lay.lowerSize(uint64(len(model))); uint64(st.Size()) != want {
				t.Fatalf("round %d step %d: after %s: lower size %d, layout says %d", round, step, what, st.Size(), want)
			}
		}
		h.Release(ctx)
		n.Forget()
	}
	// The run must have met both limits, and short writes.
	if failed[syscall.ENOSPC] < 200 || failed[syscall.EFBIG] < 30 || short < 100 {
		t.Errorf("only %v failures and %d short writes", failed, short)
	}
}

// A file whose lower size would pass the largest file offset is too big:
// EFBIG, as a lower file system says at its own limit.
func TestTooBigIsEFBIG(t *testing.T) {
	_, root := newLayer(t, toyHooks)
	var a layer.Attr
	n, h, e := root.Create(ctx, "f", syscall.O_RDWR, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer n.Forget()
	defer h.Release(ctx)
	off := int64(math.MaxInt64 - 1000) // fits above, not below: blocks grow by 1/8
	if k, e := h.Write(ctx, []byte("x"), off); e != syscall.EFBIG {
		t.Errorf("write at %d: %d, %v; want EFBIG", off, k, e)
	}
	if e := n.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(off)}, &a); e != syscall.EFBIG {
		t.Errorf("truncate to %d: %v; want EFBIG", off, e)
	}
	if e := h.Allocate(ctx, off, 1, 0); e != syscall.EFBIG {
		t.Errorf("fallocate at %d: %v; want EFBIG", off, e)
	}
	if e := n.Getattr(ctx, h, &a); e != 0 || a.Size != 0 {
		t.Errorf("size %d (%v), want 0", a.Size, e)
	}
}

// A truncate cut short reads whole when it grows the file; when it cuts
// the last block short, only that block may fail to decode. The size is
// between the old and the new, each byte old or new.
func TestCrashDuringTruncate(t *testing.T) {
	const bs = 64
	old := bytes.Repeat([]byte("0123456789abcdef"), 10)[:100] // blocks 0 and 1 (short)
	for _, size := range []int{0, 30, 64, 90, 120, 128, 150, 300} {
		want := append(bytes.Clone(old[:min(size, len(old))]), make([]byte, max(0, size-len(old)))...)
		for k := 0; ; k++ {
			dir := t.TempDir()
			root, err := layerOver(t, dir, nil)
			if err != nil {
				t.Fatal(err)
			}
			mkfile(t, root, "f", string(old))
			stopped := crashRun(t, dir, k, func(root layer.Node) {
				var a layer.Attr
				n, e := root.Lookup(ctx, "f", &a)
				mustOK(t, "lookup", e)
				defer n.Forget()
				h, e := n.Open(ctx, syscall.O_RDWR)
				mustOK(t, "open", e)
				defer h.Release(ctx)
				n.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)}, &a)
			})
			var a layer.Attr
			n, e := fresh(t, dir).Lookup(ctx, "f", &a)
			mustOK(t, "lookup after the crash", e)
			h, e := n.Open(ctx, syscall.O_RDONLY)
			mustOK(t, "open after the crash", e)
			got := int(a.Size)
			if got < min(size, len(old)) || got > max(size, len(old)) {
				t.Errorf("truncate to %d, crash at lower call %d: size %d", size, k, got)
			}
			// The block a shrink cuts short.
			torn := -1
			if size < len(old) && size%bs != 0 {
				torn = size / bs
			}
			for b := 0; b*bs < got; b++ {
				buf := make([]byte, bs)
				r, e := h.Read(ctx, buf, int64(b*bs))
				if e != 0 {
					if b != torn {
						t.Errorf("truncate to %d, crash at lower call %d: block %d: %v", size, k, b, e)
					}
					continue
				}
				for i, c := range buf[:r] {
					if at := b*bs + i; c != at1(old, at) && c != at1(want, at) {
						t.Errorf("truncate to %d, crash at lower call %d: byte %d is %q, neither old nor new", size, k, at, c)
						break
					}
				}
			}
			h.Release(ctx)
			n.Forget()
			if !stopped {
				if got != size {
					t.Errorf("truncate to %d: size %d", size, got)
				}
				break
			}
		}
	}
}

func at1(b []byte, i int) byte {
	if i < len(b) {
		return b[i]
	}
	return 0
}
