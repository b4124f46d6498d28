package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// Tests run against the engines SHALE_ETCD (members, comma-separated) and
// SHALE_S3 (http://HOST:PORT/BUCKET) name, with the AWS variables for S3:
// scripts/engines.sh starts both on loopback. Without them the tests
// fail in CI and skip elsewhere.
func engines(t testing.TB) (etcd, s3 string) {
	etcd, s3 = os.Getenv("SHALE_ETCD"), os.Getenv("SHALE_S3")
	if etcd == "" || s3 == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("SHALE_ETCD and SHALE_S3 are not set: run eval \"$(scripts/engines.sh start)\" first")
		}
		t.Skip("SHALE_ETCD and SHALE_S3 are not set (eval \"$(scripts/engines.sh start)\")")
	}
	return etcd, s3
}

// testVolume formats a new volume of block size bs and returns its URL.
// Its keys are deleted at the end.
func testVolume(t testing.TB, bs int) string {
	_, s3 := engines(t)
	return testVolumeOn(t, bs, s3)
}

// testVolumeOn is testVolume with its blocks in the S3 server at s3.
func testVolumeOn(t testing.TB, bs int, s3 string) string {
	etcd, _ := engines(t)
	var b [6]byte
	rand.Read(b[:])
	name := "t" + hex.EncodeToString(b[:])
	lower := "etcd://" + etcd + "/" + name
	u, err := ParseURL(lower)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDataURL(strings.TrimSuffix(s3, "/") + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Create(context.Background(), u, FormatOptions{Data: d, BlockSize: bs}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		eng, err := DialEtcd(context.Background(), u.Etcd)
		if err != nil {
			return
		}
		defer eng.Close()
		eng.Txn(context.Background(), func(tx Tx) error { tx.DeletePrefix(newKeys(name).p); return nil })
	})
	return lower
}

// mount opens the volume on a stack of its own, as a client.
func mount(t testing.TB, lower string) (*FS, layer.Node) {
	u, err := ParseURL(lower)
	if err != nil {
		t.Fatal(err)
	}
	fs, root, err := Open(context.Background(), stack.New(stack.Options{}), u, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs, root
}

var ctx0 = layer.WithCaller(context.Background(), layer.Caller{Uid: 0, Gid: 0, Umask: 0o022})

func must(t testing.TB, e layer.Errno) {
	t.Helper()
	if e != 0 {
		t.Fatal(e)
	}
}

func attr(t testing.TB, n layer.Node) layer.Attr {
	t.Helper()
	var a layer.Attr
	must(t, n.Getattr(ctx0, nil, &a))
	return a
}

func lookup(t testing.TB, dir layer.Node, name string) layer.Node {
	t.Helper()
	var a layer.Attr
	n, e := dir.Lookup(ctx0, name, &a)
	must(t, e)
	return n
}

func writeFile(t testing.TB, dir layer.Node, name string, data []byte) layer.Node {
	t.Helper()
	var a layer.Attr
	n, h, e := dir.Create(ctx0, name, 0, 0o644, &a)
	must(t, e)
	if _, e := h.Write(ctx0, data, 0); e != 0 {
		t.Fatal(e)
	}
	must(t, h.Flush(ctx0, 1))
	must(t, h.Release(ctx0))
	return n
}

// rewrite opens n with O_TRUNC, writes data and closes it.
func rewrite(t testing.TB, n layer.Node, data []byte) {
	t.Helper()
	h, e := n.Open(ctx0, syscall.O_WRONLY|syscall.O_TRUNC)
	must(t, e)
	if _, e := h.Write(ctx0, data, 0); e != 0 {
		t.Fatal(e)
	}
	must(t, h.Flush(ctx0, 1))
	must(t, h.Release(ctx0))
}

func readFile(t testing.TB, n layer.Node) []byte {
	t.Helper()
	h, e := n.Open(ctx0, 0)
	must(t, e)
	defer h.Release(ctx0)
	a := attr(t, n)
	buf := make([]byte, a.Size+10)
	k, e := h.Read(ctx0, buf, 0)
	must(t, e)
	return buf[:k]
}
