package wrap

import (
	"bytes"
	"encoding/hex"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
)

// toyXattrs takes user.* attributes: a name is stored as
// user.t.<hex id>.<hex name>, a value as id || name || 0 || value.
// newID, if set, runs before NewXattrID returns, as a request that wins
// the race to give the file its identity.
type toyXattrs struct{ newID func() }

func (toyXattrs) TakesXattr(name string) bool { return strings.HasPrefix(name, "user.") }
func (toyXattrs) XattrIDName() string         { return "user.tid" }
func (toyXattrs) XattrIDSize() int            { return 2 }

func (x toyXattrs) NewXattrID() ([]byte, error) {
	if x.newID != nil {
		x.newID()
	}
	return []byte{0xaa, 0xaa}, nil
}

func (toyXattrs) EncodeXattrName(id []byte, name string) (string, error) {
	return "user.t." + hex.EncodeToString(id) + "." + hex.EncodeToString([]byte(name)), nil
}

func (toyXattrs) DecodeXattrName(id []byte, l string) (string, error) {
	rest, ok := strings.CutPrefix(l, "user.t."+hex.EncodeToString(id)+".")
	name, err := hex.DecodeString(rest)
	if !ok || err != nil {
		return "", errors.New("not ours")
	}
	return string(name), nil
}

func (toyXattrs) SealXattr(id []byte, name string, v []byte) ([]byte, error) {
	return append(append(append(bytes.Clone(id), name...), 0), v...), nil
}

func (x toyXattrs) OpenXattr(id []byte, name string, s []byte) ([]byte, error) {
	head, _ := x.SealXattr(id, name, nil)
	if !bytes.HasPrefix(s, head) {
		return nil, errors.New("not this name's value")
	}
	return s[len(head):], nil
}

func lowerList(t *testing.T, path string) string {
	t.Helper()
	buf := make([]byte, 4096)
	k, err := unix.Listxattr(path, buf)
	if err != nil {
		t.Fatal(err)
	}
	return sortedNames(buf[:k])
}

// sortedNames is a list of attribute names, sorted, space-separated.
func sortedNames(list []byte) string {
	names := strings.Split(strings.TrimSuffix(string(list), "\x00"), "\x00")
	slices.Sort(names)
	return strings.Join(names, " ")
}

// The file's identity comes from the request that made it first.
func TestXattrIdentityRace(t *testing.T) {
	var path string
	x := toyXattrs{newID: func() {
		if err := unix.Setxattr(path, "user.tid", []byte{0xbb, 0xbb}, unix.XATTR_CREATE); err != nil {
			t.Error(err)
		}
	}}
	dir, root := newLayer(t, Hooks{Xattrs: x})
	path = filepath.Join(dir, "f")
	var a layer.Attr
	f, h, e := root.Create(ctx, "f", syscall.O_WRONLY, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	defer f.Forget()
	if e := f.Setxattr(ctx, "user.a", []byte("v"), 0); e != 0 {
		t.Fatal(e)
	}
	if got, want := lowerList(t, path), "user.t.bbbb."+hex.EncodeToString([]byte("user.a"))+" user.tid"; got != want {
		t.Errorf("lower %q, want %q", got, want)
	}
	buf := make([]byte, 10)
	if k, e := f.Getxattr(ctx, "user.a", buf); e != 0 || string(buf[:k]) != "v" {
		t.Errorf("get: %q, %v", buf[:k], e)
	}
	if k, e := f.Listxattr(ctx, buf); e != 0 || string(buf[:k]) != "user.a\x00" {
		t.Errorf("list: %q, %v", buf[:k], e)
	}
}

// What the codec does not take passes through; what it cannot fit in a
// lower name is ERANGE and leaves the file as it was; a value moved to
// another name is EIO.
func TestXattrTemplate(t *testing.T) {
	dir, root := newLayer(t, Hooks{Xattrs: toyXattrs{}})
	path := filepath.Join(dir, "f")
	var a layer.Attr
	f, h, e := root.Create(ctx, "f", syscall.O_WRONLY, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	h.Release(ctx)
	defer f.Forget()
	if e := f.Setxattr(ctx, "trusted.plain", []byte("p"), 0); e != 0 {
		t.Fatal(e)
	}
	long := "user." + strings.Repeat("n", 130) // 135 bytes, 270 in hex
	if e := f.Setxattr(ctx, long, []byte("l"), 0); e != syscall.ERANGE {
		t.Errorf("set a name too long once encoded: %v, want ERANGE", e)
	}
	if got := lowerList(t, path); got != "trusted.plain" {
		t.Errorf("lower %q, want only trusted.plain", got)
	}
	f.Setxattr(ctx, "user.a", []byte("a"), 0)
	f.Setxattr(ctx, "user.b", []byte("b"), 0)
	ea, _ := toyXattrs{}.EncodeXattrName([]byte{0xaa, 0xaa}, "user.a")
	eb, _ := toyXattrs{}.EncodeXattrName([]byte{0xaa, 0xaa}, "user.b")
	va := make([]byte, 100)
	k, _ := unix.Getxattr(path, ea, va)
	unix.Setxattr(path, eb, va[:k], 0)
	if _, e := f.Getxattr(ctx, "user.b", make([]byte, 10)); e != syscall.EIO {
		t.Errorf("a value moved to another name: %v, want EIO", e)
	}
	unix.Setxattr(path, "user.planted", []byte("x"), 0)
	buf := make([]byte, 1000)
	k, e = f.Listxattr(ctx, buf)
	if got := sortedNames(buf[:k]); e != 0 || got != "trusted.plain user.a user.b" {
		t.Errorf("list %q, %v: want trusted.plain, user.a and user.b", got, e)
	}
}
