package volume

import (
	"slices"
	"sync"
	"testing"

	"github.com/shalefs/shale/layer"
)

// TestOpenTellsLateWatchNot: an open that finds a data version this
// client has not served drops what the kernel holds of the file (a
// lookup may have cached the old size), and what a late watch then
// delivers of older versions tells the kernel nothing: an invalidation
// racing with the getattr that fetches the new size has the kernel keep
// the old one, and a reader after the writer's close read that many bytes
// (test/volume TestTwoMountsChurn).
func TestOpenTellsLateWatchNot(t *testing.T) {
	lower := testVolume(t, bs)
	_, ra := mount(t, lower)
	t.Setenv("SHALE_VOLUME_WATCH", "off") // b's changes come by apply
	fb, rb := mount(t, lower)
	var mu sync.Mutex
	var evs []layer.Event
	fb.st.Events().Subscribe(func(ev layer.Event) {
		mu.Lock()
		evs = append(evs, ev)
		mu.Unlock()
	})
	take := func(ino uint64) []layer.Event {
		mu.Lock()
		defer mu.Unlock()
		var out []layer.Event
		for _, ev := range evs {
			if ev.Token == token(ino) {
				out = append(out, ev)
			}
		}
		evs = nil
		return out
	}

	fa := writeFile(t, ra, "f", []byte("one"))
	nb := lookup(t, rb, "f") // b's kernel has its size now
	ino := attr(t, nb).Ino
	vs, _, err := fb.eng.Read(ctx0, fb.k.inode(ino))
	if err != nil {
		t.Fatal(err)
	}
	first := Change{Key: fb.k.inode(ino), Val: vs[0].Val, Rev: vs[0].Mod}
	rewrite(t, fa, []byte("version two"))

	take(ino)
	hb, e := nb.Open(ctx0, 0)
	must(t, e)
	defer hb.Release(ctx0)
	if got := take(ino); !slices.ContainsFunc(got, func(ev layer.Event) bool { return ev.Kind == layer.Data }) {
		t.Errorf("the first open here of a changed file raised %v, want a Data event", got)
	}
	fb.apply(first) // the watch, late
	if got := take(ino); len(got) != 0 {
		t.Errorf("a late watch's older version raised %v, want nothing", got)
	}
	buf := make([]byte, 64)
	k, e := hb.Read(ctx0, buf, 0)
	must(t, e)
	if string(buf[:k]) != "version two" {
		t.Errorf("read %q, want %q", buf[:k], "version two")
	}
}
