package crypt

import (
	"bytes"
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// The layer stacked by the wrap template over hostfs, driven through the
// layer.Node API, then its lower files tampered with directly.

var ctx = context.Background()

type tstack struct {
	st    *stack.Stack
	t     *testing.T
	l     *Layer
	lower string
	root  layer.Node
}

func newStack(t *testing.T) *tstack {
	t.Helper()
	s, err := stackOver(t, initDir(t, "p"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *tstack) create(dir layer.Node, name string, data []byte) layer.Node {
	s.t.Helper()
	var a layer.Attr
	n, h, e := dir.Create(ctx, name, syscall.O_WRONLY|syscall.O_EXCL, 0o644, &a)
	if e != 0 {
		s.t.Fatalf("create %q: %v", name, e)
	}
	if k, e := h.Write(ctx, data, 0); e != 0 || k != len(data) {
		s.t.Fatalf("write %q: %d, %v", name, k, e)
	}
	h.Release(ctx)
	return n
}

// read reads n bytes at off of dir/name.
func (s *tstack) read(dir layer.Node, name string, off int64, n int) ([]byte, layer.Errno) {
	s.t.Helper()
	var a layer.Attr
	c, e := dir.Lookup(ctx, name, &a)
	if e != 0 {
		return nil, e
	}
	defer c.Forget()
	h, e := c.Open(ctx, syscall.O_RDONLY)
	if e != 0 {
		return nil, e
	}
	defer h.Release(ctx)
	buf := make([]byte, n)
	k, e := h.Read(ctx, buf, off)
	return buf[:k], e
}

func (s *tstack) list(dir layer.Node) []string {
	s.t.Helper()
	d, e := dir.OpenDir(ctx)
	if e != 0 {
		s.t.Fatal(e)
	}
	defer d.Close()
	var names []string
	for {
		ent, ok, e := d.Next(ctx)
		if e != 0 {
			s.t.Fatal(e)
		}
		if !ok {
			break
		}
		if ent.Name != "." && ent.Name != ".." {
			names = append(names, ent.Name)
		}
	}
	slices.Sort(names)
	return names
}

// lowerPath is the host path of name in the root directory.
func (s *tstack) lowerPath(name string) string {
	s.t.Helper()
	id, err := os.ReadFile(filepath.Join(s.lower, dirIDName))
	if err != nil {
		s.t.Fatal(err)
	}
	enc, err := s.l.EncodeName(id, name)
	if err != nil {
		s.t.Fatal(err)
	}
	return filepath.Join(s.lower, enc)
}

func TestStack(t *testing.T) {
	s := newStack(t)
	r := rand.New(rand.NewPCG(11, 12))
	data := randBytes(r, 3*blockSize+1000)
	s.create(s.root, "hello.txt", data)
	if got, e := s.read(s.root, "hello.txt", 0, len(data)+10); e != 0 || !bytes.Equal(got, data) {
		t.Fatalf("read back: %d bytes, %v", len(got), e)
	}
	// The lower file: header, three whole blocks, a short one; the
	// plaintext appears nowhere in it.
	st, err := os.Stat(s.lowerPath("hello.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(headerSize + 3*(blockSize+blockOverhead) + 1000 + blockOverhead); st.Size() != want {
		t.Errorf("lower size %d, want %d", st.Size(), want)
	}
	raw, _ := os.ReadFile(s.lowerPath("hello.txt"))
	if bytes.Contains(raw, data[:64]) {
		t.Error("the plaintext is in the lower file")
	}
	// A partial overwrite across a block boundary (read-modify-write).
	var a layer.Attr
	n, _ := s.root.Lookup(ctx, "hello.txt", &a)
	h, _ := n.Open(ctx, syscall.O_RDWR)
	patch := bytes.Repeat([]byte("P"), 100)
	h.Write(ctx, patch, blockSize-50)
	h.Release(ctx)
	n.Forget()
	copy(data[blockSize-50:], patch)
	if got, e := s.read(s.root, "hello.txt", 0, len(data)); e != 0 || !bytes.Equal(got, data) {
		t.Fatalf("read after overwrite: %v", e)
	}

	// Directories, long and unicode names, rename, symlinks.
	var da layer.Attr
	sub, e := s.root.Mkdir(ctx, "sub dir ☃", 0o755, &da)
	if e != 0 {
		t.Fatal(e)
	}
	long := strings.Repeat("ł", 127) // 254 bytes
	s.create(sub, long, []byte("long"))
	if e := s.root.Rename(ctx, "hello.txt", sub, "renamed.txt", 0); e != 0 {
		t.Fatal(e)
	}
	if got, e := s.read(sub, "renamed.txt", 0, len(data)); e != 0 || !bytes.Equal(got, data) {
		t.Fatalf("read after rename: %v", e)
	}
	if got, e := s.read(sub, long, 0, 10); e != 0 || string(got) != "long" {
		t.Fatalf("read of a long name: %q, %v", got, e)
	}
	target := []byte("../some/where/ünï")
	if _, e := s.root.Symlink(ctx, target, "link", &a); e != 0 {
		t.Fatal(e)
	}
	ln, _ := s.root.Lookup(ctx, "link", &a)
	if got, e := ln.Readlink(ctx); e != 0 || !bytes.Equal(got, target) {
		t.Fatalf("readlink = %q, %v", got, e)
	}
	if a.Size != uint64(len(target)) {
		t.Errorf("symlink size %d, want %d", a.Size, len(target))
	}
	if got, _ := os.Readlink(s.lowerPath("link")); strings.Contains(got, "where") {
		t.Errorf("lower symlink target %q is not encrypted", got)
	}
	if got := s.list(s.root); !slices.Equal(got, []string{"link", "sub dir ☃"}) {
		t.Errorf("root lists %q", got)
	}
	if got := s.list(sub); !slices.Equal(got, []string{"renamed.txt", long}) {
		t.Errorf("sub lists %q", got)
	}
	// Names below are encrypted: nothing of the plaintext names shows.
	entries, _ := os.ReadDir(s.lower)
	for _, ent := range entries {
		if strings.Contains(ent.Name(), "sub") || strings.Contains(ent.Name(), "link") {
			t.Errorf("lower name %q is not encrypted", ent.Name())
		}
	}
	// Emptied, the directory goes despite its ID file.
	sub.Unlink(ctx, long)
	sub.Unlink(ctx, "renamed.txt")
	if e := s.root.Rmdir(ctx, "sub dir ☃"); e != 0 {
		t.Errorf("rmdir: %v", e)
	}
}

// patch changes the lower file of name in place.
func (s *tstack) patch(name string, f func(b []byte) []byte) {
	s.t.Helper()
	p := s.lowerPath(name)
	b, err := os.ReadFile(p)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(p, f(b), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// Every tampering with the lower files makes the affected read fail with
// EIO; untouched blocks still read.
func TestStackTamper(t *testing.T) {
	s := newStack(t)
	r := rand.New(rand.NewPCG(13, 14))
	const sb = blockSize + blockOverhead
	data := randBytes(r, 3*blockSize+1000)
	at := func(blk int) int { return headerSize + blk*sb }
	wantEIO := func(name string, blk int) {
		t.Helper()
		got, e := s.read(s.root, name, int64(blk*blockSize), 10)
		if e != syscall.EIO {
			t.Errorf("%s: read of block %d = %d bytes, %v; want EIO", name, blk, len(got), e)
		}
	}
	wantOK := func(name string, blk int) {
		t.Helper()
		got, e := s.read(s.root, name, int64(blk*blockSize), 10)
		if e != 0 || !bytes.Equal(got, data[blk*blockSize:blk*blockSize+10]) {
			t.Errorf("%s: read of untouched block %d = %v", name, blk, e)
		}
	}
	names := []string{"flip nonce", "flip ciphertext", "flip tag", "swap", "moved", "truncated", "header", "header version", "donor", "zeroed"}
	for _, name := range names {
		s.create(s.root, name, data)
	}
	s.patch("flip nonce", func(b []byte) []byte { b[at(1)+3] ^= 1; return b })
	s.patch("flip ciphertext", func(b []byte) []byte { b[at(1)+blockNonceSize+100] ^= 0x80; return b })
	s.patch("flip tag", func(b []byte) []byte { b[at(2)-1] ^= 1; return b })
	s.patch("swap", func(b []byte) []byte {
		b0 := slices.Clone(b[at(0):at(1)])
		copy(b[at(0):], b[at(1):at(2)])
		copy(b[at(1):], b0)
		return b
	})
	donor, _ := os.ReadFile(s.lowerPath("donor"))
	s.patch("moved", func(b []byte) []byte { copy(b[at(1):at(2)], donor[at(1):]); return b })
	s.patch("truncated", func(b []byte) []byte { return b[:at(3)+500] })
	s.patch("header", func(b []byte) []byte { copy(b, donor[:headerSize]); return b })
	s.patch("header version", func(b []byte) []byte { b[1] = 2; return b })

	for _, name := range []string{"flip nonce", "flip ciphertext", "flip tag", "moved"} {
		wantOK(name, 0)
		wantEIO(name, 1)
		wantOK(name, 2)
	}
	wantEIO("swap", 0)
	wantEIO("swap", 1)
	wantOK("swap", 2)
	wantOK("truncated", 2)
	wantEIO("truncated", 3)
	for blk := range 4 {
		wantEIO("header", blk)
		wantEIO("header version", blk)
	}

	// A renamed-behind-our-back file vanishes rather than showing under
	// another name; its name can't be tampered into another either.
	if err := os.Rename(s.lowerPath("donor"), s.lowerPath("donor")+"x"); err != nil {
		t.Fatal(err)
	}
	if got := s.list(s.root); slices.Contains(got, "donor") || len(got) != len(names)-1 {
		t.Errorf("after a lower rename the root lists %q", got)
	}

	// A tampered symlink target reads as EIO.
	var a layer.Attr
	s.root.Symlink(ctx, []byte("/target"), "link", &a)
	lp := s.lowerPath("link")
	stored, _ := os.Readlink(lp)
	os.Remove(lp)
	os.Symlink("A"+stored[1:], lp)
	if stored[0] == 'A' {
		os.Remove(lp)
		os.Symlink("B"+stored[1:], lp)
	}
	ln, e := s.root.Lookup(ctx, "link", &a)
	if e != 0 {
		t.Fatal(e)
	}
	if got, e := ln.Readlink(ctx); e != syscall.EIO {
		t.Errorf("readlink of a tampered target = %q, %v; want EIO", got, e)
	}

	// A block overwritten with zeros: the wrap template reads an all-zero
	// stored block as a hole, as gocryptfs does (a known limit, in
	// docs/crypt-format.md): it reads as zeros. Any other bytes would be
	// wrong plaintext.
	s.patch("zeroed", func(b []byte) []byte { clear(b[at(1):at(2)]); return b })
	if got, e := s.read(s.root, "zeroed", blockSize, 10); e != syscall.EIO && !bytes.Equal(got, make([]byte, len(got))) {
		t.Errorf("a zeroed block reads as %x, %v: want zeros (a hole) or EIO", got, e)
	}
}
