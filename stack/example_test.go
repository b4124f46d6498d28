package stack_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shalefs/shale/crypt"
	"github.com/shalefs/shale/fuseview"
	"github.com/shalefs/shale/hostfs"
	_ "github.com/shalefs/shale/rot13" // registers the layer rot13
	"github.com/shalefs/shale/stack"
)

// A Go program builds a stack, a directory with crypt over it, and mounts
// it. (As root: it mounts a FUSE file system.)
func Example() {
	lower, _ := os.MkdirTemp("", "vault")
	mnt, _ := os.MkdirTemp("", "mnt")
	defer os.RemoveAll(lower)
	defer os.Remove(mnt)
	pass := []byte("correct horse battery staple")
	ctx := context.Background()
	st := stack.New(stack.Options{})
	dir, _ := hostfs.New(st, lower)
	if err := crypt.Init(ctx, dir, lower, pass, crypt.Options{ScryptLogN: 10}); err != nil { // once, as shale init does
		fmt.Println(err)
		return
	}

	c, _ := crypt.Open(ctx, dir, lower, pass)
	vault, _ := c.Stack(ctx, st, dir)
	srv, err := fuseview.Mount(mnt, st, vault, fuseview.Options{Coherent: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Unmount()

	os.WriteFile(filepath.Join(mnt, "note"), []byte("hello"), 0o600)
	b, _ := os.ReadFile(filepath.Join(mnt, "note"))
	fmt.Printf("%s through the mount\n", b)
	// Output:
	// hello through the mount
}

// The same stack from a spec: the form of the command line's --layer flags
// and of stack files, with the layers their packages registered.
func ExampleSpec() {
	lower, _ := os.MkdirTemp("", "plain")
	defer os.RemoveAll(lower)
	sp := &stack.Spec{Lower: lower, Layers: []stack.Layer{{Name: "rot13"}}}
	st, nodes, err := sp.Build(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(len(nodes), "nodes: the directory and rot13 over it;", st.Manager() != nil)
	// Output:
	// 2 nodes: the directory and rot13 over it; true
}
