package wrap

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
	"golang.org/x/sys/unix"
)

var ctx = context.Background()

// toy is a size-changing codec with everything the template must handle:
// an 8-byte header, 8 bytes of overhead per block (a block-bound checksum
// and the length), small blocks so tests cross many of them, a reversible
// name code and a link code.
type toy struct{}

func (toy) BlockSize() int  { return 64 }
func (toy) Overhead() int   { return 8 }
func (toy) HeaderSize() int { return 8 }

func (toy) NewHeader() ([]byte, error) {
	h := make([]byte, 8)
	crand.Read(h)
	h[0] = 1 // never all zeros
	return h, nil
}

func (toy) CheckHeader(h []byte) error {
	if h[0] != 1 {
		return errors.New("bad header")
	}
	return nil
}

func (toy) sum(hdr []byte, blk uint64, p []byte) uint32 {
	c := crc32.ChecksumIEEE(hdr)
	c = crc32.Update(c, crc32.IEEETable, binary.BigEndian.AppendUint64(nil, blk))
	return crc32.Update(c, crc32.IEEETable, p) | 1 // never zero
}

func (t toy) EncodeBlock(dst, hdr []byte, blk uint64, p []byte) ([]byte, error) {
	dst = binary.BigEndian.AppendUint32(dst, t.sum(hdr, blk, p))
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(p)))
	for _, c := range p {
		dst = append(dst, c^0x5a)
	}
	return dst, nil
}

func (t toy) DecodeBlock(dst, hdr []byte, blk uint64, s []byte) ([]byte, error) {
	p := make([]byte, len(s)-8)
	for i, c := range s[8:] {
		p[i] = c ^ 0x5a
	}
	if binary.BigEndian.Uint32(s[4:]) != uint32(len(p)) || binary.BigEndian.Uint32(s) != t.sum(hdr, blk, p) {
		return nil, errors.New("checksum mismatch")
	}
	return append(dst, p...), nil
}

func (toy) EncodeName(dir []byte, name string) (string, error) {
	return "n" + strings.Repeat("x", len(dir)) + fmt.Sprintf("%x", name), nil
}

func (toy) DecodeName(dir []byte, l string) (string, error) {
	var b []byte
	if _, err := fmt.Sscanf(strings.TrimPrefix(l, "n"+strings.Repeat("x", len(dir))), "%x", &b); err != nil || !strings.HasPrefix(l, "n") {
		return "", errors.New("not ours")
	}
	return string(b), nil
}

func (toy) DirIDFile() string         { return ".id" }
func (toy) NewDirID() ([]byte, error) { return []byte{1, 2}, nil }
func (toy) DirIDSize() int            { return 2 }

func (toy) EncodeLink(t []byte) ([]byte, error) { return append([]byte("L:"), t...), nil }
func (toy) LinkSize(stored uint64) uint64       { return stored - 2 }
func (toy) DecodeLink(s []byte) ([]byte, error) {
	if !bytes.HasPrefix(s, []byte("L:")) {
		return nil, errors.New("not a link of ours")
	}
	return s[2:], nil
}

// toyHooks are every hook, from toy.
var toyHooks = Hooks{Blocks: toy{}, Header: toy{}, Names: toy{}, Dirs: toy{}, Links: toy{}}

func newLayer(t *testing.T, hooks Hooks) (string, layer.Node) {
	t.Helper()
	dir := t.TempDir()
	st := stack.New(stack.Options{})
	lower, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lower.Forget)
	if hooks.Dirs != nil {
		giveRootID(t, dir)
	}
	n, err := New(ctx, st, lower, hooks)
	if err != nil {
		t.Fatal(err)
	}
	return dir, n
}

// giveRootID does what a layer's setup does before New: it gives the
// root directory dir toy's identity, unless it has one.
func giveRootID(t *testing.T, dir string) {
	t.Helper()
	err := os.WriteFile(filepath.Join(dir, toy{}.DirIDFile()), []byte{1, 2}, 0o444)
	if err != nil && !os.IsPermission(err) {
		t.Fatal(err)
	}
}

// New never makes the root's identity: one made over a lost one would
// hide every entry of the root.
func TestNewRefusesRootWithoutIdentity(t *testing.T) {
	dir := t.TempDir()
	st := stack.New(stack.Options{})
	lower, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lower.Forget()
	if _, err := New(ctx, st, lower, toyHooks); err == nil || !strings.Contains(err.Error(), "identity file") {
		t.Fatalf("New over a root without its identity: %v, want an error naming the identity file", err)
	}
	if _, err := os.Lstat(filepath.Join(dir, toy{}.DirIDFile())); !os.IsNotExist(err) {
		t.Fatalf("New made a root identity: %v", err)
	}
	for _, bad := range [][]byte{{1}, {1, 2, 3}} {
		os.Remove(filepath.Join(dir, toy{}.DirIDFile()))
		os.WriteFile(filepath.Join(dir, toy{}.DirIDFile()), bad, 0o644)
		if _, err := New(ctx, st, lower, toyHooks); err == nil {
			t.Fatalf("New over a root identity of %d bytes: no error", len(bad))
		}
	}
}

// Random writes, truncates and reads through the layer agree with a byte
// slice, and the lower file always has the size the layout implies; with
// FillHoles, no stored block is ever all zeros (a hole).
func TestDataAgainstModel(t *testing.T) {
	filled := toyHooks
	filled.FillHoles = true
	t.Run("holes", func(t *testing.T) { dataAgainstModel(t, toyHooks) })
	t.Run("filled", func(t *testing.T) { dataAgainstModel(t, filled) })
}

func dataAgainstModel(t *testing.T, hooks Hooks) {
	dir, root := newLayer(t, hooks)
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 20; round++ {
		var a layer.Attr
		name := fmt.Sprintf("f%d", round)
		n, h, e := root.Create(ctx, name, syscall.O_RDWR, 0o644, &a)
		if e != 0 {
			t.Fatal(e)
		}
		var model []byte
		for step := 0; step < 60; step++ {
			switch op := r.IntN(10); {
			case op < 6:
				off := r.IntN(700)
				data := make([]byte, 1+r.IntN(300))
				for i := range data {
					data[i] = byte(r.IntN(255) + 1)
				}
				if k, e := h.Write(ctx, data, int64(off)); e != 0 || k != len(data) {
					t.Fatalf("write %d@%d: %d %v", len(data), off, k, e)
				}
				if end := off + len(data); end > len(model) {
					model = append(model, make([]byte, end-len(model))...)
				}
				copy(model[off:], data)
			case op < 8:
				size := r.IntN(900)
				if e := n.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetSize, Size: uint64(size)}, &a); e != 0 {
					t.Fatalf("truncate %d: %v", size, e)
				}
				if size < len(model) {
					model = model[:size]
				} else {
					model = append(model, make([]byte, size-len(model))...)
				}
			default:
				off, k := r.IntN(1000), r.IntN(400)
				buf := make([]byte, k)
				got, e := h.Read(ctx, buf, int64(off))
				if e != 0 {
					t.Fatalf("read: %v", e)
				}
				want := []byte{}
				if off < len(model) {
					want = model[off:min(off+k, len(model))]
				}
				if !bytes.Equal(buf[:got], want) {
					t.Fatalf("round %d step %d: read %d@%d differs", round, step, k, off)
				}
			}
			if e := n.Getattr(ctx, h, &a); e != 0 || a.Size != uint64(len(model)) {
				t.Fatalf("size %d, model %d (%v)", a.Size, len(model), e)
			}
			if hooks.FillHoles {
				if b := zeroBlock(t, n); b >= 0 {
					t.Fatalf("round %d step %d: block %d is stored as zeros", round, step, b)
				}
			}
		}
		h.Release(ctx)
		n.Forget()
		enc, _ := toy{}.EncodeName([]byte{1, 2}, name)
		st, err := os.Stat(filepath.Join(dir, enc))
		if err != nil {
			t.Fatal(err)
		}
		if want := (&fs{bs: 64, ov: 8, hs: 8, blocks: toy{}}).lowerSize(uint64(len(model))); uint64(st.Size()) != want {
			t.Fatalf("lower size %d, layout says %d", st.Size(), want)
		}
	}
}

func TestNamesLinksAndLongNames(t *testing.T) {
	dir, root := newLayer(t, toyHooks)
	var a layer.Attr
	long := strings.Repeat("é", 127) // 254 bytes; encoded far past 255
	for _, name := range []string{"plain", long} {
		d, e := root.Mkdir(ctx, name, 0o755, &a)
		if e != 0 {
			t.Fatalf("Mkdir %q: %v", name[:5], e)
		}
		s, e := d.Symlink(ctx, []byte("../target"), "link", &a)
		if e != 0 {
			t.Fatal(e)
		}
		if a.Size != uint64(len("../target")) {
			t.Errorf("symlink size %d, want the target's length", a.Size)
		}
		if got, e := s.Readlink(ctx); e != 0 || string(got) != "../target" {
			t.Errorf("Readlink: %q %v", got, e)
		}
		s.Forget()
		d.Forget()
	}
	list := func() []string {
		ds, e := root.OpenDir(ctx)
		if e != 0 {
			t.Fatal(e)
		}
		defer ds.Close()
		var names []string
		for {
			ent, ok, e := ds.Next(ctx)
			if e != 0 || !ok {
				return names
			}
			names = append(names, ent.Name)
		}
	}
	got := strings.Join(list(), "|")
	for _, want := range []string{"plain", long} {
		if !strings.Contains(got, want) {
			t.Errorf("listing lacks %q", want[:5])
		}
	}
	if strings.Contains(got, ".id") || strings.Contains(got, longPrefix) {
		t.Errorf("listing shows the layer's own files: %q", got)
	}
	if e := root.Rename(ctx, long, root, "short", 0); e != 0 {
		t.Fatal(e)
	}
	if e := root.Rename(ctx, "plain", root, long, 0); e != 0 {
		t.Fatal(e)
	}
	if c, e := root.Lookup(ctx, long, &a); e != 0 {
		t.Fatalf("Lookup of the long name after rename: %v", e)
	} else {
		c.Forget()
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 { // .id, short, long stand-in and its sidecar, nothing else
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("lower holds %v", names)
	}
	if e := root.Rmdir(ctx, long); e != syscall.ENOTEMPTY {
		t.Fatalf("Rmdir of a directory with a symlink in it: %v, want ENOTEMPTY", e)
	}
	d, e := root.Lookup(ctx, long, &a)
	if e != 0 {
		t.Fatal(e)
	}
	if e := d.Unlink(ctx, "link"); e != 0 {
		t.Fatalf("Unlink in the directory after the failed Rmdir: %v", e)
	}
	d.Forget()
	if e := root.Rmdir(ctx, long); e != 0 {
		t.Fatal(e)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("sidecar left behind: %d lower entries", len(ents))
	}
}

// A damaged block fails the read; it never returns other bytes.
func TestDamageIsEIO(t *testing.T) {
	dir, root := newLayer(t, toyHooks)
	var a layer.Attr
	n, h, e := root.Create(ctx, "f", syscall.O_RDWR, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	h.Write(ctx, bytes.Repeat([]byte("abcd"), 64), 0)
	h.Release(ctx)
	enc, _ := toy{}.EncodeName([]byte{1, 2}, "f")
	p := filepath.Join(dir, enc)
	b, _ := os.ReadFile(p)
	b[8+72+20] ^= 1 // a byte of block 1
	os.WriteFile(p, b, 0o644)
	h, _ = n.Open(ctx, syscall.O_RDONLY)
	defer h.Release(ctx)
	buf := make([]byte, 256)
	if _, e := h.Read(ctx, buf, 0); e != syscall.EIO {
		t.Errorf("read over a damaged block: %v, want EIO", e)
	}
	if k, e := h.Read(ctx, buf[:64], 128); e != 0 || k != 64 {
		t.Errorf("read of an undamaged block: %d %v", k, e)
	}
	n.Forget()
}

// A failed create of an existing long name, and a rename of a link onto
// another link of the same file, must leave every name listed.
func TestLongNamesSurviveNoOps(t *testing.T) {
	_, root := newLayer(t, toyHooks)
	count := func() int {
		ds, e := root.OpenDir(ctx)
		if e != 0 {
			t.Fatal(e)
		}
		defer ds.Close()
		n := 0
		for {
			ent, ok, _ := ds.Next(ctx)
			if !ok {
				return n
			}
			if ent.Name != "." && ent.Name != ".." {
				n++
			}
		}
	}
	a, b := strings.Repeat("a", 200), strings.Repeat("b", 200)
	var at layer.Attr
	c, h, e := root.Create(ctx, a, syscall.O_RDWR|syscall.O_EXCL, 0o644, &at)
	if e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	if _, _, e := root.Create(ctx, a, syscall.O_RDWR|syscall.O_EXCL, 0o644, &at); e != syscall.EEXIST {
		t.Fatalf("second exclusive create: %v", e)
	}
	if _, e := root.Mkdir(ctx, a, 0o755, &at); e != syscall.EEXIST {
		t.Fatalf("mkdir over it: %v", e)
	}
	if k := count(); k != 1 {
		t.Fatalf("%d names after failed creates, want 1", k)
	}
	if _, e := root.Link(ctx, c, b, &at); e != 0 {
		t.Fatal(e)
	}
	if e := root.Rename(ctx, a, root, b, 0); e != 0 {
		t.Fatal(e)
	}
	if k := count(); k != 2 {
		t.Fatalf("%d names after renaming a link onto its twin, want 2", k)
	}
	c.Forget()
}

// zeroBlock gives the first block of toy file n stored as all zeros, or -1.
func zeroBlock(t *testing.T, n layer.Node) int {
	t.Helper()
	h, e := n.(*node).Lower.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		t.Fatal(e)
	}
	defer h.Release(ctx)
	buf := make([]byte, 1<<16)
	k, e := h.Read(ctx, buf, 0)
	if e != 0 {
		t.Fatal(e)
	}
	stored := buf[min(k, toy{}.HeaderSize()):k]
	for b := 0; len(stored) > 0; b++ {
		blk := stored[:min(len(stored), toy{}.BlockSize()+toy{}.Overhead())]
		if allZero(blk) {
			return b
		}
		stored = stored[len(blk):]
	}
	return -1
}

// noSetuid refuses to set the setuid bit, as a SetattrChecker may.
type noSetuid struct{}

func (noSetuid) CheckSetattr(ctx context.Context, cur *layer.Attr, in *layer.SetAttr) layer.Errno {
	if in.Valid&layer.SetMode != 0 && in.Mode&syscall.S_ISUID != 0 && cur.Mode&syscall.S_ISUID == 0 {
		return syscall.EPERM
	}
	return 0
}

// A SetattrChecker sees each change with the file's attributes before the
// layer below does, and what it refuses does not happen.
func TestSetattrChecker(t *testing.T) {
	dir, root := newLayer(t, Hooks{Attrs: noSetuid{}})
	var a layer.Attr
	c, h, e := root.Create(ctx, "f", syscall.O_RDWR|syscall.O_EXCL, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer c.Forget()
	defer h.Release(ctx)
	if e := c.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o4755}, &a); e != syscall.EPERM {
		t.Errorf("chmod 4755: %v, want EPERM", e)
	}
	if e := c.Setattr(ctx, h, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o600}, &a); e != 0 || a.Mode&0o7777 != 0o600 {
		t.Errorf("chmod 600: %v, mode %o", e, a.Mode)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dir, "f"), &st); err != nil || st.Mode&0o7777 != 0o600 {
		t.Errorf("lower mode %o (%v), want 600", st.Mode&0o7777, err)
	}
}

// A handle opened for writing only reads nothing, though the layer below
// reads too (blocks are read to be written): a 9P export would otherwise
// pass a Tread through it.
func TestWriteOnlyHandleDoesNotRead(t *testing.T) {
	_, root := newLayer(t, toyHooks)
	var a layer.Attr
	c, h, e := root.Create(ctx, "f", syscall.O_RDWR|syscall.O_EXCL, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer c.Forget()
	if _, e := h.Write(ctx, []byte("secret"), 0); e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	w, e := c.Open(ctx, syscall.O_WRONLY)
	if e != 0 {
		t.Fatal(e)
	}
	defer w.Release(ctx)
	if k, e := w.Read(ctx, make([]byte, 16), 0); e != syscall.EBADF {
		t.Errorf("read through a write-only handle: %d bytes, %v; want EBADF", k, e)
	}
	if _, e := w.Write(ctx, []byte("S"), 0); e != 0 {
		t.Errorf("write: %v", e)
	}
}
