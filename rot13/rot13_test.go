package rot13

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"testing/quick"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

func TestRoundTrip(t *testing.T) {
	var c codec
	f := func(p []byte) bool {
		enc, _ := c.EncodeBlock(nil, nil, 0, p)
		dec, _ := c.DecodeBlock(nil, nil, 0, enc)
		return bytes.Equal(dec, p) && len(enc) == len(p)
	}
	if err := quick.Check(f, nil); err != nil {
		t.Error(err)
	}
	enc, _ := c.EncodeBlock([]byte("x"), nil, 0, []byte("Hello, World! az AZ mn MN @[`{"))
	if string(enc) != "xUryyb, Jbeyq! nm NM za ZA @[`{" {
		t.Errorf("rot13 gives %q", enc)
	}
}

// Through the layer, the lower file holds the rot13 of what was written.
func TestStoredAsRot13(t *testing.T) {
	dir := t.TempDir()
	st := stack.New(stack.Options{})
	lower, err := hostfs.New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	defer lower.Forget()
	ctx := context.Background()
	root, err := New(ctx, st, lower)
	if err != nil {
		t.Fatal(err)
	}
	var a layer.Attr
	n, h, e := root.Create(ctx, "f", syscall.O_RDWR, 0o644, &a)
	if e != 0 {
		t.Fatal(e)
	}
	defer n.Forget()
	h.Write(ctx, []byte("Stackable"), 0)
	h.Write(ctx, []byte("Z"), 20) // past the end: a hole of zeros between
	h.Release(ctx)
	b, _ := os.ReadFile(filepath.Join(dir, "f"))
	if want := "Fgnpxnoyr\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00M"; string(b) != want {
		t.Errorf("lower holds %q, want %q", b, want)
	}
}
