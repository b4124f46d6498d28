package hostfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// mountFS mounts a new file system of type typ (tmpfs, ramfs, or ext2 on
// a loop device, made with 128-byte inodes, which keep no birth time)
// and opens it, in st, until the test ends.
func mountFS(t *testing.T, st *stack.Stack, typ string) (string, layer.Node) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test mounts file systems: run it as root")
	}
	base := t.TempDir()
	dir := filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	switch typ {
	case "ext2":
		img := filepath.Join(base, "img")
		if out, err := exec.Command("mkfs.ext2", "-q", "-F", "-I", "128", img, "4M").CombinedOutput(); err != nil {
			t.Fatalf("mkfs.ext2: %v\n%s", err, out)
		}
		if out, err := exec.Command("mount", "-o", "loop", img, dir).CombinedOutput(); err != nil {
			t.Fatalf("mount -o loop: %v\n%s", err, out)
		}
	default:
		err = unix.Mount(typ, dir, typ, 0, "")
	}
	if err != nil {
		t.Fatalf("mount %s: %v", typ, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			t.Errorf("unmount %s: %v", typ, err)
		}
	})
	root, err := New(st, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(root.Forget) // before the unmount
	return dir, root
}

func statxOf(t *testing.T, p string) *unix.Statx_t {
	t.Helper()
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS|unix.STATX_BTIME, &st); err != nil {
		t.Fatal(err)
	}
	return &st
}

// tokenOnce is the token a node of name in dir gets, found and forgotten,
// so that nothing keeps its inode.
func tokenOnce(t *testing.T, root layer.Node, name string) layer.Token {
	t.Helper()
	var a layer.Attr
	n, e := root.Lookup(ctx, name, &a)
	if e != 0 {
		t.Fatalf("Lookup(%q): %v", name, e)
	}
	defer n.Forget()
	return n.Token()
}

// Where statx reports a birth time, it is the generation.
func TestGenerationIsBirthTime(t *testing.T) {
	dir, root := mountFS(t, stack.New(stack.Options{}), "tmpfs")
	os.WriteFile(filepath.Join(dir, "a"), nil, 0o644)
	st := statxOf(t, filepath.Join(dir, "a"))
	if st.Mask&unix.STATX_BTIME == 0 {
		t.Fatal("tmpfs reports no birth time")
	}
	if got, want := tokenOnce(t, root, "a").Gen, uint64(st.Btime.Sec)*1e9+uint64(st.Btime.Nsec); got != want {
		t.Errorf("generation %d, want the birth time %d", got, want)
	}
}

// On ext2, which keeps no birth time, a file made after another is deleted
// takes its inode number, and must not take its token.
func TestGenerationTellsReusedInodes(t *testing.T) {
	dir, root := mountFS(t, stack.New(stack.Options{}), "ext2")
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, nil, 0o644)
	if statxOf(t, a).Mask&unix.STATX_BTIME != 0 {
		t.Fatal("ext2 with 128-byte inodes reports a birth time: the test needs a file system without")
	}
	old := tokenOnce(t, root, "a")
	if again := tokenOnce(t, root, "a"); again != old || old.Gen == 0 {
		t.Errorf("one file has tokens %v and %v; want one, with a generation", old, again)
	}
	os.Remove(a)
	os.WriteFile(b, nil, 0o644)
	if ino := statxOf(t, b).Ino; ino != old.Ino {
		t.Fatalf("the new file has inode %d, not the deleted one's %d: the test needs it reused", ino, old.Ino)
	}
	if tok := tokenOnce(t, root, "b"); tok == old {
		t.Errorf("a new file that reuses a deleted one's inode has its token %v", tok)
	}
}

// events keeps the events a stack raises.
type events struct {
	mu  sync.Mutex
	evs []layer.Event
}

func (r *events) add(ev layer.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

// On ramfs, with neither birth times nor handles, the generation is
// minted: one for a file while a node holds it, which the events about
// the file carry too, and never 0.
func TestGenerationMinted(t *testing.T) {
	st := stack.New(stack.Options{})
	dir, root := mountFS(t, st, "ramfs")
	a := filepath.Join(dir, "a")
	os.WriteFile(a, nil, 0o644)
	os.Link(a, filepath.Join(dir, "b"))
	if statxOf(t, a).Mask&unix.STATX_BTIME != 0 {
		t.Fatal("ramfs reports a birth time: the test needs a file system without")
	}
	if _, _, err := unix.NameToHandleAt(unix.AT_FDCWD, a, 0); err == nil {
		t.Fatal("ramfs has file handles: the test needs a file system without")
	}
	var at layer.Attr
	n, e := root.Lookup(ctx, "a", &at)
	if e != 0 {
		t.Fatal(e)
	}
	defer n.Forget()
	tok := n.Token()
	if tok.Gen == 0 {
		t.Error("a minted generation is 0")
	}
	if other := tokenOnce(t, root, "b"); other != tok {
		t.Errorf("a link found while a node holds the file has token %v, want the node's %v", other, tok)
	}
	var got events
	st.Events().Subscribe(got.add)
	if e := root.Unlink(ctx, "b"); e != 0 {
		t.Fatal(e)
	}
	for _, ev := range got.evs {
		if ev.Kind == layer.Attrs && ev.Token != tok {
			t.Errorf("the event about the unlinked file's links has token %v, want the node's %v", ev.Token, tok)
		}
	}
	if len(got.evs) != 2 {
		t.Errorf("unlink raised %v, want the file's attributes and the directory's entries", got.evs)
	}
}
