package crypt

import (
	"bytes"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// Extended attributes through a crypt stack, compared with a native file,
// then attacked in LOWER.

// lowerXattrs reads every extended attribute of the lower file path.
func lowerXattrs(t *testing.T, path string) map[string][]byte {
	t.Helper()
	buf := make([]byte, 1<<16)
	k, err := unix.Llistxattr(path, buf)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]byte{}
	for _, name := range strings.Split(strings.TrimSuffix(string(buf[:k]), "\x00"), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 1<<16)
		k, err := unix.Lgetxattr(path, name, v)
		if err != nil {
			t.Fatal(err)
		}
		m[name] = v[:k]
	}
	return m
}

// lookup returns dir/name's node.
func (s *tstack) lookup(dir layer.Node, name string) layer.Node {
	s.t.Helper()
	var a layer.Attr
	n, e := dir.Lookup(ctx, name, &a)
	if e != 0 {
		s.t.Fatalf("lookup %q: %v", name, e)
	}
	s.t.Cleanup(n.Forget)
	return n
}

// getx gets name of n through the view: its value or errno name.
func getx(n layer.Node, name string) string {
	buf := make([]byte, 1<<16)
	k, e := n.Getxattr(ctx, name, buf)
	if e != 0 {
		return unix.ErrnoName(e)
	}
	return fmt.Sprintf("%q", buf[:k])
}

// listx lists n's attributes through the view, sorted.
func listx(t *testing.T, n layer.Node) []string {
	t.Helper()
	buf := make([]byte, 1<<16)
	k, e := n.Listxattr(ctx, buf)
	if e != 0 {
		t.Fatal(e)
	}
	names := strings.Split(strings.TrimSuffix(string(buf[:k]), "\x00"), "\x00")
	slices.Sort(names)
	return slices.DeleteFunc(names, func(s string) bool { return s == "" })
}

func TestXattrEncryptedBelow(t *testing.T) {
	s := newStack(t)
	f := s.create(s.root, "f", []byte("data"))
	name, value := "user.comment", []byte("the plaintext of the comment")
	if e := f.Setxattr(ctx, name, value, 0); e != 0 {
		t.Fatal(e)
	}
	if got := getx(f, name); got != fmt.Sprintf("%q", value) {
		t.Fatalf("get %s = %s", name, got)
	}
	below := lowerXattrs(t, s.lowerPath("f"))
	if len(below) != 2 {
		t.Errorf("lower attributes %q, want the identity and one", slices.Collect(mapKeys(below)))
	}
	if id := below[xattrIDName]; len(id) != xattrIDSize {
		t.Errorf("identity %x, want %d bytes", id, xattrIDSize)
	}
	for lname, v := range below {
		if strings.Contains(lname, "comment") || bytes.Contains(v, []byte("plaintext")) {
			t.Errorf("plain text below: %q = %q", lname, v)
		}
		if lname != xattrIDName && (!strings.HasPrefix(lname, xattrNamePrefix) || len(v) != len(value)+xattrOverhead) {
			t.Errorf("lower attribute %q of %d bytes, want %s… of %d", lname, len(v), xattrNamePrefix, len(value)+xattrOverhead)
		}
	}
	// Equal names on two files look different below.
	g := s.create(s.root, "g", nil)
	g.Setxattr(ctx, name, value, 0)
	for lname := range lowerXattrs(t, s.lowerPath("g")) {
		if _, ok := below[lname]; ok && lname != xattrIDName {
			t.Errorf("%s is the same lower name on two files", lname)
		}
	}
}

func mapKeys(m map[string][]byte) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// xattrOps are getxattr(2) and friends on one file.
type xattrOps interface {
	get(name string, dest []byte) (int, error)
	set(name string, v []byte, flags int) error
	list(dest []byte) (int, error)
	remove(name string) error
}

type nativeXattrs string

func (p nativeXattrs) get(name string, d []byte) (int, error) {
	return unix.Getxattr(string(p), name, d)
}
func (p nativeXattrs) set(name string, v []byte, fl int) error {
	return unix.Setxattr(string(p), name, v, fl)
}
func (p nativeXattrs) list(d []byte) (int, error) { return unix.Listxattr(string(p), d) }
func (p nativeXattrs) remove(name string) error   { return unix.Removexattr(string(p), name) }

type viewXattrs struct{ n layer.Node }

func orNil(e layer.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func (v viewXattrs) get(name string, d []byte) (int, error) {
	k, e := v.n.Getxattr(ctx, name, d)
	return k, orNil(e)
}
func (v viewXattrs) set(name string, val []byte, fl int) error {
	return orNil(v.n.Setxattr(ctx, name, val, uint32(fl)))
}
func (v viewXattrs) list(d []byte) (int, error) {
	k, e := v.n.Listxattr(ctx, d)
	return k, orNil(e)
}
func (v viewXattrs) remove(name string) error { return orNil(v.n.Removexattr(ctx, name)) }

// xattrSteps runs the same steps on x and records what each gives.
func xattrSteps(x xattrOps) []string {
	var obs []string
	note := func(step string, k int, err error) {
		r := fmt.Sprint(k)
		if err != nil {
			r = unix.ErrnoName(err.(syscall.Errno))
		}
		obs = append(obs, step+": "+r)
	}
	get := func(step, name string, size int) {
		var buf []byte
		if size > 0 {
			buf = make([]byte, size)
		}
		k, err := x.get(name, buf)
		note(step, k, err)
		if err == nil && size > 0 {
			obs = append(obs, fmt.Sprintf("%s value: %q", step, buf[:k]))
		}
	}
	list := func(step string, size int) {
		var buf []byte
		if size > 0 {
			buf = make([]byte, size)
		}
		k, err := x.list(buf)
		note(step, k, err)
		if err == nil && size > 0 {
			names := strings.Split(string(buf[:k]), "\x00")
			slices.Sort(names)
			obs = append(obs, fmt.Sprintf("%s names: %q", step, names))
		}
	}
	set := func(step, name, v string, flags int) { note(step, 0, x.set(name, []byte(v), flags)) }
	remove := func(step, name string) { note(step, 0, x.remove(name)) }

	get("get before any", "user.a", 100)
	list("list before any", 100)
	remove("remove before any", "user.a")
	set("REPLACE before any", "user.a", "1", unix.XATTR_REPLACE)
	// A namespace alone is EINVAL whether or not the file has an
	// identity yet.
	for _, ns := range []string{"user.", "trusted."} {
		get("get "+ns+" before any", ns, 10)
		remove("remove "+ns+" before any", ns)
		set("set "+ns+" before any", ns, "1", 0)
		set("REPLACE "+ns+" before any", ns, "1", unix.XATTR_REPLACE)
	}
	set("set user.a", "user.a", "1", 0)
	for _, ns := range []string{"user.", "trusted."} {
		get("get "+ns+" with one", ns, 10)
		remove("remove "+ns+" with one", ns)
	}
	set("set user.b", "user.b", "hello\x00world", 0)
	set("set user.empty", "user.empty", "", 0)
	get("size query", "user.b", 0)
	get("exact buffer", "user.b", 11)
	get("buffer too small", "user.b", 3)
	get("empty value", "user.empty", 10)
	get("missing", "user.zz", 10)
	list("list size query", 0)
	list("list exact", 25)
	list("list too small", 5)
	set("CREATE existing", "user.a", "2", unix.XATTR_CREATE)
	set("REPLACE missing", "user.zz", "2", unix.XATTR_REPLACE)
	set("REPLACE existing", "user.a", "22", unix.XATTR_REPLACE)
	set("CREATE new", "user.c", "3", unix.XATTR_CREATE)
	get("replaced", "user.a", 10)
	remove("remove", "user.a")
	get("removed", "user.a", 10)
	remove("remove again", "user.a")
	set("trusted", "trusted.t", "t", 0)
	get("trusted", "trusted.t", 10)
	set("security", "security.shale-test", "s", 0)
	get("security", "security.shale-test", 10)
	set("unknown namespace", "bogus.a", "1", 0)
	long := "user." + strings.Repeat("n", 154) // 159 bytes: the longest crypt takes
	set("159-byte name", long, "l", 0)
	get("159-byte name", long, 10)
	set("overwrite", "user.b", strings.Repeat("v", 3000), 0)
	get("overwrite", "user.b", 0)
	list("list after", 1000)
	return obs
}

func TestXattrLikeNative(t *testing.T) {
	s := newStack(t)
	view := xattrSteps(viewXattrs{s.create(s.root, "f", nil)})
	native := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(native, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := xattrSteps(nativeXattrs(native))
	if !slices.Equal(view, want) {
		for i := range max(len(view), len(want)) {
			var v, w string
			if i < len(view) {
				v = view[i]
			}
			if i < len(want) {
				w = want[i]
			}
			if v != w {
				t.Errorf("crypt  %s\nnative %s", v, w)
			}
		}
	}
	// Only the security.* attribute is in plain text below.
	for lname := range lowerXattrs(t, s.lowerPath("f")) {
		if lname != xattrIDName && lname != "security.shale-test" && !strings.HasPrefix(lname, xattrNamePrefix) {
			t.Errorf("lower attribute %q", lname)
		}
	}
}

// Names the codec cannot fit into a lower name, and what is not root's.
func TestXattrLimits(t *testing.T) {
	s := newStack(t)
	f := s.create(s.root, "f", nil)
	long := "user." + strings.Repeat("n", 155) // 160 bytes: 176 padded, 235+13 encoded
	if e := f.Setxattr(ctx, long, []byte("x"), 0); e != syscall.ERANGE {
		t.Errorf("set a 160-byte name: %v, want ERANGE", e)
	}
	if below := lowerXattrs(t, s.lowerPath("f")); len(below) != 0 {
		t.Errorf("a refused name left %q", slices.Collect(mapKeys(below)))
	}
	f.Setxattr(ctx, "user.a", []byte("a"), 0)
	if got := getx(f, long); got != "ENODATA" {
		t.Errorf("get a 160-byte name: %s, want ENODATA", got)
	}
	if e := f.Removexattr(ctx, long); e != syscall.ENODATA {
		t.Errorf("remove a 160-byte name: %v, want ENODATA", e)
	}
	// trusted.* is root's (CAP_SYS_ADMIN), though stored as user.*.
	if e := f.Setxattr(ctx, "trusted.t", []byte("t"), 0); e != 0 {
		t.Fatal(e)
	}
	other := layer.WithCaller(ctx, layer.Caller{Uid: 1000, Gid: 1000})
	if e := f.Setxattr(other, "trusted.u", []byte("u"), 0); e != syscall.EPERM {
		t.Errorf("set trusted.* as uid 1000: %v, want EPERM", e)
	}
	if e := f.Removexattr(other, "trusted.t"); e != syscall.EPERM {
		t.Errorf("remove trusted.* as uid 1000: %v, want EPERM", e)
	}
	if _, e := f.Getxattr(other, "trusted.t", make([]byte, 10)); e != syscall.ENODATA {
		t.Errorf("get trusted.* as uid 1000: %v, want ENODATA", e)
	}
	buf := make([]byte, 100)
	k, _ := f.Listxattr(other, buf)
	if got := string(buf[:k]); got != "user.a\x00" {
		t.Errorf("list as uid 1000: %q, want user.a only", got)
	}
	// A symlink takes no lower user.* attributes: trusted.* fails as
	// user.* does natively.
	var a layer.Attr
	l, e := s.root.Symlink(ctx, []byte("f"), "l", &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer l.Forget()
	if e := l.Setxattr(ctx, "trusted.t", []byte("t"), 0); e != syscall.EPERM {
		t.Errorf("trusted.* on a symlink: %v, want EPERM", e)
	}
}

// Attacks by someone who can write LOWER but has no key.
func TestXattrTamper(t *testing.T) {
	s := newStack(t)
	a := s.create(s.root, "a", nil)
	b := s.create(s.root, "b", nil)
	for _, x := range []struct {
		n           layer.Node
		name, value string
	}{{a, "user.comment", "A's secret"}, {a, "user.x", "X"}, {a, "user.y", "Y"}, {b, "user.comment", "B's"}, {b, "user.other", "o"}} {
		if e := x.n.Setxattr(ctx, x.name, []byte(x.value), 0); e != 0 {
			t.Fatal(e)
		}
	}
	pa, pb := s.lowerPath("a"), s.lowerPath("b")
	la, lb := lowerXattrs(t, pa), lowerXattrs(t, pb)
	id := func(p string) []byte { return lowerXattrs(t, p)[xattrIDName] }
	lname := func(id []byte, name string) string {
		n, err := s.l.EncodeXattrName(id, name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	aComment, bComment := lname(id(pa), "user.comment"), lname(id(pb), "user.comment")
	setLower := func(p, name string, v []byte) {
		t.Helper()
		if err := unix.Lsetxattr(p, name, v, 0); err != nil {
			t.Fatal(err)
		}
	}
	// fresh looks the file up again: nothing remembered from before.
	fresh := func(name string) layer.Node { return s.lookup(s.root, name) }

	// A's attribute, name and value, copied onto B: not B's.
	cp := s.create(s.root, "c", nil)
	cp.Setxattr(ctx, "user.mine", []byte("m"), 0)
	pc := s.lowerPath("c")
	setLower(pc, aComment, la[aComment])
	if got := listx(t, fresh("c")); !slices.Equal(got, []string{"user.mine"}) {
		t.Errorf("after copying A's attribute onto C, C lists %q", got)
	}
	if got := getx(fresh("c"), "user.comment"); got != "ENODATA" {
		t.Errorf("C's user.comment after copying A's below: %s", got)
	}
	// A's value over B's value of the same name: EIO, never A's value.
	setLower(pb, bComment, la[aComment])
	if got := getx(fresh("b"), "user.comment"); got != "EIO" {
		t.Errorf("B's user.comment holding A's value: %s, want EIO", got)
	}
	setLower(pb, bComment, lb[bComment])
	if got := getx(fresh("b"), "user.comment"); got != `"B's"` {
		t.Errorf("B's own value back: %s", got)
	}
	// Two values of one file swapped.
	ax, ay := lname(id(pa), "user.x"), lname(id(pa), "user.y")
	setLower(pa, ax, la[ay])
	setLower(pa, ay, la[ax])
	for _, name := range []string{"user.x", "user.y"} {
		if got := getx(fresh("a"), name); got != "EIO" {
			t.Errorf("swapped %s: %s, want EIO", name, got)
		}
	}
	// A flipped byte: in the nonce, the ciphertext, the tag.
	for _, i := range []int{0, xattrNonceSize + 1, len(la[aComment]) - 1} {
		v := bytes.Clone(la[aComment])
		v[i] ^= 1
		setLower(pa, aComment, v)
		if got := getx(fresh("a"), "user.comment"); got != "EIO" {
			t.Fatalf("value with byte %d flipped: %s, want EIO", i, got)
		}
	}
	setLower(pa, aComment, la[aComment][:xattrOverhead-1])
	if got := getx(fresh("a"), "user.comment"); got != "EIO" {
		t.Errorf("value cut short: %s, want EIO", got)
	}
	// A flipped character in a lower name hides it.
	setLower(pa, aComment, la[aComment])
	flipped := aComment[:len(aComment)-2] + string(aComment[len(aComment)-2]^1) + aComment[len(aComment)-1:]
	if err := unix.Lremovexattr(pa, aComment); err != nil {
		t.Fatal(err)
	}
	setLower(pa, flipped, la[aComment])
	if got := listx(t, fresh("a")); slices.Contains(got, "user.comment") {
		t.Errorf("a name altered below still lists: %q", got)
	}
	// Another identity hides every name; a damaged one is EIO.
	setLower(pb, xattrIDName, bytes.Repeat([]byte{7}, xattrIDSize))
	if got := listx(t, fresh("b")); len(got) != 0 {
		t.Errorf("with another identity B lists %q", got)
	}
	if got := getx(fresh("b"), "user.comment"); got != "ENODATA" {
		t.Errorf("with another identity B's user.comment: %s", got)
	}
	setLower(pb, xattrIDName, []byte("short"))
	if got := getx(fresh("b"), "user.comment"); got != "EIO" {
		t.Errorf("with a damaged identity: %s, want EIO", got)
	}
	// Plain user.* attributes put below are hidden.
	setLower(pc, "user.planted", []byte("p"))
	if got := listx(t, fresh("c")); !slices.Equal(got, []string{"user.mine"}) {
		t.Errorf("a plain attribute put below lists: %q", got)
	}
}

// POSIX ACLs pass through in plain: the lower kernel enforces them.
func TestXattrACLPassThrough(t *testing.T) {
	s := newStack(t)
	f := s.create(s.root, "f", nil)
	// user::rw- user:1000:r-- group::r-- mask::r-- other::--- (linux/posix_acl_xattr.h)
	acl := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range []struct {
		tag, perm uint16
		id        uint32
	}{{0x01, 6, ^uint32(0)}, {0x02, 4, 1000}, {0x04, 4, ^uint32(0)}, {0x10, 4, ^uint32(0)}, {0x20, 0, ^uint32(0)}} {
		acl = binary.LittleEndian.AppendUint16(acl, e.tag)
		acl = binary.LittleEndian.AppendUint16(acl, e.perm)
		acl = binary.LittleEndian.AppendUint32(acl, e.id)
	}
	if e := f.Setxattr(ctx, "system.posix_acl_access", acl, 0); e != 0 {
		t.Fatal(e)
	}
	below := lowerXattrs(t, s.lowerPath("f"))
	if got := below["system.posix_acl_access"]; !bytes.Equal(got, acl) {
		t.Errorf("lower ACL %x, want %x", got, acl)
	}
	if _, ok := below[xattrIDName]; ok {
		t.Error("an ACL gave the file an identity")
	}
	var a layer.Attr
	if e := f.Getattr(ctx, nil, &a); e != 0 || a.Mode&0o777 != 0o640 {
		t.Errorf("mode %o (%v), want 0640 from the ACL's mask and other", a.Mode&0o777, e)
	}
	if got := getx(f, "system.posix_acl_access"); got != fmt.Sprintf("%q", acl) {
		t.Errorf("ACL through the view: %s", got)
	}
	if got := listx(t, f); !slices.Equal(got, []string{"system.posix_acl_access"}) {
		t.Errorf("list %q", got)
	}
}

// Version 1 directories keep attributes in plain, as before.
func TestXattrVersion1Plain(t *testing.T) {
	l, err := newLayer(make([]byte, masterKeySize), 1)
	if err != nil {
		t.Fatal(err)
	}
	if l.xattrCodec() != nil {
		t.Fatal("version 1 has an xattr codec")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, dirIDName), make([]byte, dirIDSize), 0o444); err != nil {
		t.Fatal(err)
	}
	st := stack.New(stack.Options{})
	hroot, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	root, err := l.Stack(ctx, st, hroot)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Forget(); hroot.Forget() })
	s := &tstack{st: st, t: t, l: l, lower: dir, root: root}
	f := s.create(root, "f", nil)
	if e := f.Setxattr(ctx, "user.comment", []byte("plain"), 0); e != 0 {
		t.Fatal(e)
	}
	below := lowerXattrs(t, s.lowerPath("f"))
	if len(below) != 1 || string(below["user.comment"]) != "plain" {
		t.Errorf("lower attributes %q, want user.comment in plain", below)
	}
}

// Known answers, checked against Python's cryptography (AESSIV, AESGCM):
// master key seq(0, 32), identity seq(0x30, 16), name user.comment, nonce
// seq(0xd0, 12), value "shale xattr known-answer".
const (
	katXattrKey   = "76843807620e0aab4f5d24db6b753a4bac7e887d99d29de350a690cb318e31bb50e6689a001766872bb5baee533a4e878a491a9ea1bfa6f0b8fba3f4fdd58331fa31092e2c011ceb15ea687a8090f0e932ea1ff95f96c3be360e546f5addc34f"
	katXattrName  = "user.shale.x.xzAITfxZ_zv3sk4PKWDU7yhhHYS0cGKIg9OxuY0HT2I"
	katXattrValue = "d0d1d2d3d4d5d6d7d8d9dadbffb695498ab22cc1aa2fe97a77e6feac1c8600ca9ce0d161fbd9f05038a9b4ba01588c88da2d893a"
)

func TestXattrKnownAnswers(t *testing.T) {
	master := seq(0, masterKeySize)
	key, err := hkdf.Key(sha256.New, master, nil, infoXattrs, 96)
	if err != nil {
		t.Fatal(err)
	}
	l, err := newLayer(master, 2)
	if err != nil {
		t.Fatal(err)
	}
	id := seq(0x30, xattrIDSize)
	name, err := l.EncodeXattrName(id, "user.comment")
	if err != nil {
		t.Fatal(err)
	}
	value := l.sealXattr(seq(0xd0, xattrNonceSize), id, "user.comment", []byte("shale xattr known-answer"))
	for _, kv := range [][3]string{
		{"xattr key", hex.EncodeToString(key), katXattrKey},
		{"xattr name", name, katXattrName},
		{"xattr value", hex.EncodeToString(value), katXattrValue},
	} {
		if kv[1] != kv[2] {
			t.Errorf("%s = %s\nwant %s", kv[0], kv[1], kv[2])
		}
	}
	if got, err := l.DecodeXattrName(id, name); err != nil || got != "user.comment" {
		t.Errorf("DecodeXattrName = %q, %v", got, err)
	}
	if got, err := l.OpenXattr(id, "user.comment", value); err != nil || string(got) != "shale xattr known-answer" {
		t.Errorf("OpenXattr = %q, %v", got, err)
	}
}

// Names the layer never stores encrypted are refused; a sealed name with
// bad padding does not decode.
func TestXattrNameChecks(t *testing.T) {
	l := testLayer(t)
	for _, name := range []string{"", "user.", "security.selinux", "system.posix_acl_access", "user.a\x00b", "user." + strings.Repeat("n", 251)} {
		if _, err := l.EncodeXattrName(seq(0x30, 16), name); err == nil {
			t.Errorf("EncodeXattrName(%q) took it", name)
		} else if !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ERANGE) {
			t.Errorf("EncodeXattrName(%q): %v, want EINVAL or ERANGE", name, err)
		}
	}
	id := seq(0x30, 16)
	for _, p := range []string{"user.a", "user.a\x01", "user.0123456789\x00"} {
		lower := xattrNamePrefix + nameEncoding.EncodeToString(l.xnames.seal(nil, [][]byte{id}, []byte(p)))
		if got, err := l.DecodeXattrName(id, lower); err == nil {
			t.Errorf("%q sealed unpadded decodes to %q", p, got)
		}
	}
}
