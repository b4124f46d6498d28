package crypt

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// The attacks of an independent review (issue 15), each performed by
// someone who can write LOWER but has no key; each worked before its fix.

// stackOver stacks the layer over lower directory dir, opened with pass.
func stackOver(t *testing.T, dir string) (*tstack, error) {
	t.Helper()
	st := stack.New(stack.Options{})
	hroot, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hroot.Forget)
	l, err := Open(ctx, hroot, dir, []byte("p"))
	if err != nil {
		return nil, err
	}
	root, err := l.Stack(ctx, st, hroot)
	if err != nil {
		return nil, err
	}
	t.Cleanup(root.Forget)
	return &tstack{st: st, t: t, l: l, lower: dir, root: root}, nil
}

// File-ID poisoning (gocryptfs' audit, 2.2): a file that holds only a
// header, planted from a victim file, must not keep it at its first write,
// or the blocks written under the victim's file ID could be moved into
// the victim and read back without error.
func TestFileIDPoisoning(t *testing.T) {
	s := newStack(t)
	r := rand.New(rand.NewPCG(21, 22))
	secret := randBytes(r, 2*blockSize)
	s.create(s.root, "victim", secret)
	s.create(s.root, "bait", nil).Forget()
	victim, _ := os.ReadFile(s.lowerPath("victim"))
	if err := os.WriteFile(s.lowerPath("bait"), victim[:headerSize], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, e := s.read(s.root, "bait", 0, 10); e != 0 || len(got) != 0 {
		t.Fatalf("a header-only file reads %q, %v; want empty", got, e)
	}
	chosen := bytes.Repeat([]byte("attacker's choice"), blockSize/16)[:blockSize]
	s.writeAt("bait", chosen, 0)
	bait, _ := os.ReadFile(s.lowerPath("bait"))
	if bytes.Equal(bait[:headerSize], victim[:headerSize]) {
		t.Error("the first write kept the planted header")
	}
	// Move the bait's block into the victim's first block.
	const sb = blockSize + blockOverhead
	copy(victim[headerSize:headerSize+sb], bait[headerSize:headerSize+sb])
	if err := os.WriteFile(s.lowerPath("victim"), victim, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, e := s.read(s.root, "victim", 0, 10); e != syscall.EIO {
		t.Errorf("the victim's moved-in block reads %q, %v; want EIO", got, e)
	}
	if got, e := s.read(s.root, "bait", 0, blockSize); e != 0 || !bytes.Equal(got, chosen) {
		t.Errorf("the bait reads back %d bytes, %v", len(got), e)
	}
}

// writeAt writes data at off of file name in the root.
func (s *tstack) writeAt(name string, data []byte, off int64) {
	s.t.Helper()
	var a layer.Attr
	n, e := s.root.Lookup(ctx, name, &a)
	if e != 0 {
		s.t.Fatal(e)
	}
	defer n.Forget()
	h, e := n.Open(ctx, syscall.O_RDWR)
	if e != 0 {
		s.t.Fatal(e)
	}
	defer h.Release(ctx)
	if k, e := h.Write(ctx, data, off); e != 0 || k != len(data) {
		s.t.Fatalf("write %s: %d, %v", name, k, e)
	}
}

// With fill_holes (shale init --no-holes), a block stored as zeros is not
// a hole: zeroing a block, or growing a file with zeros below, fails to
// read; growing and filling through the view stores encrypted blocks.
func TestFillHoles(t *testing.T) {
	dir := t.TempDir()
	if err := Init(ctx, lowerOf(t, dir), dir, []byte("p"), Options{ScryptLogN: testLogN, FillHoles: true}); err != nil {
		t.Fatal(err)
	}
	s, err := stackOver(t, dir)
	if err != nil {
		t.Fatal(err)
	}
	const sb = blockSize + blockOverhead
	r := rand.New(rand.NewPCG(23, 24))
	data := randBytes(r, 3*blockSize)
	for _, name := range []string{"zeroed", "grown below"} {
		s.create(s.root, name, data)
	}
	s.patch("zeroed", func(b []byte) []byte { clear(b[headerSize+sb : headerSize+2*sb]); return b })
	s.patch("grown below", func(b []byte) []byte { return append(b, make([]byte, sb)...) })
	if got, e := s.read(s.root, "zeroed", blockSize, 10); e != syscall.EIO {
		t.Errorf("a zeroed block reads %x, %v; want EIO", got, e)
	}
	if got, e := s.read(s.root, "grown below", 3*blockSize, 10); e != syscall.EIO {
		t.Errorf("zeros appended below read %x, %v; want EIO", got, e)
	}

	// Holes made through the view: a write past the end, a truncate up.
	s.create(s.root, "sparse", []byte("start"))
	s.writeAt("sparse", []byte("end"), 5*blockSize+7)
	var a layer.Attr
	n, e := s.root.Lookup(ctx, "sparse", &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer n.Forget()
	if e := n.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetSize, Size: 9 * blockSize}, &a); e != 0 {
		t.Fatal(e)
	}
	want := make([]byte, 9*blockSize)
	copy(want, "start")
	copy(want[5*blockSize+7:], "end")
	if got, e := s.read(s.root, "sparse", 0, len(want)+1); e != 0 || !bytes.Equal(got, want) {
		t.Errorf("the filled file reads %d bytes, %v", len(got), e)
	}
	stored, _ := os.ReadFile(s.lowerPath("sparse"))
	if len(stored) != headerSize+9*sb {
		t.Fatalf("lower size %d, want %d", len(stored), headerSize+9*sb)
	}
	for b := range 9 {
		if allZero(stored[headerSize+b*sb : headerSize+(b+1)*sb]) {
			t.Errorf("block %d is stored as zeros", b)
		}
	}
}

func allZero(b []byte) bool { return !slices.ContainsFunc(b, func(c byte) bool { return c != 0 }) }

// A deleted root directory ID must not be silently replaced: the root
// would list nothing, and the old ID would be gone.
func TestRootIDLost(t *testing.T) {
	s := newStack(t)
	s.create(s.root, "kept", []byte("data")).Forget()
	idPath := filepath.Join(s.lower, dirIDName)
	id, err := os.ReadFile(idPath)
	if err != nil {
		t.Fatalf("init wrote no root ID: %v", err)
	}
	os.Remove(idPath)
	_, err = stackOver(t, s.lower)
	if err == nil || !strings.Contains(err.Error(), "is missing: restore it from a backup") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("open without the root ID: %v; want one line asking for a restore", err)
	}
	if _, err := os.Stat(idPath); !os.IsNotExist(err) {
		t.Fatalf("a new root ID was made: %v", err)
	}
	os.WriteFile(idPath, id[:5], 0o444)
	if _, err = stackOver(t, s.lower); err == nil || !strings.Contains(err.Error(), "is 5 bytes instead of 16") {
		t.Fatalf("open with a cut root ID: %v", err)
	}
	os.Remove(idPath)
	os.WriteFile(idPath, id, 0o444)
	s2, err := stackOver(t, s.lower)
	if err != nil {
		t.Fatal(err)
	}
	if got := s2.list(s2.root); !slices.Equal(got, []string{"kept"}) {
		t.Errorf("with the ID restored the root lists %q", got)
	}

	// A root with nothing in it yet (as version 1's init left it) gets one.
	dir := initDir(t, "p")
	os.Remove(filepath.Join(dir, dirIDName))
	if _, err := stackOver(t, dir); err != nil {
		t.Fatalf("an empty root without its ID: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, dirIDName)); err != nil || len(b) != dirIDSize {
		t.Errorf("the empty root got no ID: %v", err)
	}

	// So does one that holds only files no encrypted name can be: those
	// kept by version 1's init --force, which left the ID to the first
	// mount, or an ext4 root's lost+found. They never decode, whatever
	// the ID.
	dir = initDir(t, "p")
	os.Remove(filepath.Join(dir, dirIDName))
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("plain"), 0o644)
	os.Mkdir(filepath.Join(dir, "lost+found"), 0o700)
	if _, err := stackOver(t, dir); err != nil {
		t.Fatalf("a root of plain files without its ID: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, dirIDName)); err != nil || len(b) != dirIDSize {
		t.Errorf("the root of plain files got no ID: %v", err)
	}
}

// Long names' sidecars must match their stand-ins, and directory IDs must
// be 16 bytes: otherwise a listing shows names twice or under the wrong
// entry.
func TestSidecarAndDirIDChecks(t *testing.T) {
	s := newStack(t)
	a, b := strings.Repeat("a", 200), strings.Repeat("b", 200)
	s.create(s.root, a, []byte("A")).Forget()
	s.create(s.root, b, []byte("B")).Forget()
	sidecar := func(name string) string {
		sum := sha256.Sum256([]byte(s.lowerPathName(name)))
		return filepath.Join(s.lower, ".shale.L."+nameEncoding.EncodeToString(sum[:])+".name")
	}
	side, err := os.ReadFile(sidecar(a))
	if err != nil {
		t.Fatalf("no sidecar for a long name: %v", err)
	}
	os.Remove(sidecar(b))
	if err := os.WriteFile(sidecar(b), side, 0o444); err != nil {
		t.Fatal(err)
	}
	if got := s.list(s.root); !slices.Equal(got, []string{a}) {
		t.Errorf("with b's sidecar replaced by a's, the root lists %d names (%.10q…), want a alone", len(got), got)
	}

	var attr layer.Attr
	d, e := s.root.Mkdir(ctx, "d", 0o755, &attr)
	if e != 0 {
		t.Fatal(e)
	}
	s.create(d, "inner", []byte("x")).Forget()
	d.Forget()
	lowerID := filepath.Join(s.lowerPath("d"), dirIDName)
	id, _ := os.ReadFile(lowerID)
	os.Chmod(lowerID, 0o644)
	os.WriteFile(lowerID, append(id, 1), 0o444)
	s2, err := stackOver(t, s.lower) // no cached ID
	if err != nil {
		t.Fatal(err)
	}
	d, e = s2.root.Lookup(ctx, "d", &attr)
	if e != 0 {
		t.Fatal(e)
	}
	defer d.Forget()
	if _, e := d.OpenDir(ctx); e != syscall.EIO {
		t.Errorf("listing a directory with a 17-byte ID: %v, want EIO", e)
	}
}

// From version 2, names are padded: lower names tell a name's length only
// to 16 bytes. Version 1 directories still read as they were.
func TestNamePaddingAndVersion1(t *testing.T) {
	l2, _ := newLayer(make([]byte, masterKeySize), 2)
	dir := make([]byte, dirIDSize)
	lens := map[int]bool{}
	for n := 1; n <= 15; n++ {
		enc, _ := l2.EncodeName(dir, strings.Repeat("x", n))
		lens[len(enc)] = true
		if back, err := l2.DecodeName(dir, enc); err != nil || back != strings.Repeat("x", n) {
			t.Errorf("round trip of %d bytes: %q, %v", n, back, err)
		}
	}
	if len(lens) != 1 {
		t.Errorf("names of 1 to 15 bytes have %d lower lengths, want 1", len(lens))
	}
	// A version-2 layer refuses a name sealed with bad padding.
	for _, p := range [][]byte{[]byte("abc"), append([]byte("abc"), bytes.Repeat([]byte{0}, 13)...), append([]byte("abc"), bytes.Repeat([]byte{17}, 13)...)} {
		enc := nameEncoding.EncodeToString(l2.names.seal(nil, [][]byte{dir}, p))
		if _, err := l2.DecodeName(dir, enc); err == nil {
			t.Errorf("a name sealed with padding %x decodes", p[3:])
		}
	}

	// A version-1 directory: names unpadded, as before.
	d := t.TempDir()
	writeV1Config(t, d)
	s, err := stackOver(t, d)
	if err != nil {
		t.Fatal(err)
	}
	if s.l.version != 1 {
		t.Fatalf("version %d", s.l.version)
	}
	s.create(s.root, "old", []byte("data")).Forget()
	if _, err := os.Stat(s.lowerPath("old")); err != nil || len(s.lowerPathName("old")) != nameEncoding.EncodedLen(sivTagSize+3) {
		t.Errorf("a version-1 name is %q (%v), want an unpadded one", s.lowerPathName("old"), err)
	}
}

// lowerPathName is the lower name of name in the root.
func (s *tstack) lowerPathName(name string) string { return filepath.Base(s.lowerPath(name)) }

// writeV1Config makes dir a version-1 crypt directory, as an older shale
// did: the config alone, no root ID.
func writeV1Config(t *testing.T, dir string) {
	t.Helper()
	c := &config{Format: configFormat, Version: 1, Nonce: make([]byte, wrapNonceSize),
		KDF: kdfParams{Name: kdfScrypt, LogN: testLogN, R: 8, P: 1, Salt: make([]byte, saltSize)}}
	if err := c.wrap(make([]byte, masterKeySize), []byte("p")); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(dir, ConfigName), b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// The version and its flags are bound into the wrapped key: a config
// lowered to version 1, or with fill_holes dropped, does not open.
func TestConfigDowngrade(t *testing.T) {
	dir := t.TempDir()
	if err := Init(ctx, lowerOf(t, dir), dir, []byte("p"), Options{ScryptLogN: testLogN, FillHoles: true}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, ConfigName)
	orig, _ := os.ReadFile(path)
	for _, change := range []func(c *config){
		func(c *config) { c.Version, c.FillHoles = 1, false },
		func(c *config) { c.FillHoles = false },
	} {
		var c config
		json.Unmarshal(orig, &c)
		change(&c)
		c.Checksum = c.checksum()
		b, _ := json.Marshal(&c)
		os.WriteFile(path, b, 0o600)
		if _, err := stackOver(t, dir); !errors.Is(err, ErrWrongPassphrase) {
			t.Errorf("a downgraded config opens: %v", err)
		}
	}
}
