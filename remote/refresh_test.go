package remote

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/shalefs/shale/export"
	"github.com/shalefs/shale/layer"
)

// A directory's attributes come back to the cache after this client's
// own changes of its names: its next stat sends nothing, and shows the
// server's mtime. A change made after the refresh was asked is not
// hidden by its answer.
func TestDirRefreshedAfterOwnChanges(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	d := mkdir(t, a, "d")
	for _, name := range []string{"f", "g", "h"} {
		_, h := create(t, d, name)
		h.Release(bg)
	}
	must(t, d.Unlink(bg, "g"), "unlink g")
	must(t, d.Rename(bg, "h", d, "i", 0), "rename h i")
	deadline := time.Now().Add(time.Minute)
	for a.fs.Stats().DirsRefreshed == 0 || !cachedAttr(d) {
		if time.Now().After(deadline) {
			t.Fatalf("d's attributes not asked again: %+v", a.fs.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := a.fs.Stats().Requests["getattr"]
	var at layer.Attr
	must(t, d.Getattr(bg, nil, &at), "stat d")
	if n := a.fs.Stats().Requests["getattr"] - before; n != 0 {
		t.Errorf("stat of d after the refresh sent %d Tgetattrs, want none", n)
	}
	st, err := os.Stat(filepath.Join(x.dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if !at.Mtime.Equal(st.ModTime()) {
		t.Errorf("d's mtime on a: %v, on the server: %v", at.Mtime, st.ModTime())
	}

	// One more change: the next stat shows it, refreshed or not.
	_, h := create(t, d, "j")
	h.Release(bg)
	must(t, d.Getattr(bg, nil, &at), "stat d")
	st, err = os.Stat(filepath.Join(x.dir, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if !at.Mtime.Equal(st.ModTime()) {
		t.Errorf("d's mtime on a after the create of j: %v, on the server: %v", at.Mtime, st.ModTime())
	}
}

// Changes closer together than the pause wait for one refresh.
func TestDirRefreshOnceForABurst(t *testing.T) {
	x := newSpriteServer(t, export.Options{})
	a := spriteClient(t, x, "a", Options{})
	r := &a.fs.refresh
	r.mu.Lock()
	r.after = time.Hour
	r.mu.Unlock()
	d := mkdir(t, a, "d")
	for _, name := range []string{"f", "g", "h"} {
		_, h := create(t, d, name)
		h.Release(bg)
	}
	must(t, d.Unlink(bg, "g"), "unlink g")
	r.mu.Lock()
	n := len(r.dirs)
	r.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d refreshes waiting after a change of the root and 4 of d, want 2", n)
	}
}

func cachedAttr(n layer.Node) bool {
	nd := n.(*node)
	_, _, ok := nd.fs.cc.Attr(nd.tok.Ino)
	return ok
}

// A listing cached before this client's own create is read again in the
// background: the next listing of the directory, and its stat, send no
// request, and show the new name.
func TestListingRefreshedAfterOwnCreate(t *testing.T) {
	_, a, d := listedDir(t, -time.Hour, -2*time.Hour)
	_, h := create(t, d, "y")
	h.Release(bg)
	dn := d.(*node)
	deadline := time.Now().Add(time.Minute)
	for {
		_, listed := a.fs.cc.Listing(dn.tok.Ino, uint32(os.Getuid()))
		if listed && cachedAttr(d) && a.fs.Stats().ListsRefreshed == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("d's listing not read again: %+v", a.fs.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	before := a.fs.Stats().Requests
	if got := names(t, d); !slices.Equal(got, []string{"x", "y"}) {
		t.Fatalf("a listed %q, want [x y]", got)
	}
	var at layer.Attr
	must(t, d.Getattr(bg, nil, &at), "stat d")
	after := a.fs.Stats().Requests
	for k, v := range after {
		if v != before[k] {
			t.Errorf("listing and stat after the refresh: %d %s requests, want none", v-before[k], k)
		}
	}
}
