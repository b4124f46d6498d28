package coherence

import (
	"fmt"
	"testing"

	"github.com/shalefs/shale/layer"
)

// at is a layer's node as the manager sees it: it translates events by
// adding its name to Name, and counts how often it is asked.
type at struct {
	layer.Node // the rest of the node is never used
	name       string
	asked      int
}

func (a *at) Translate(ev layer.Event) []layer.Event {
	a.asked++
	ev.Name += a.name
	return []layer.Event{ev}
}

// plain is a node whose layer does not translate events.
type plain struct{ layer.Node }

type recorder struct{ got []string }

func (h *recorder) Invalidate(ev layer.Event) { h.got = append(h.got, ev.Name) }

// Each holder is given the events of the layer it holds the stack at,
// translated once for all the holders there; the view that made the
// change is given nothing.
func TestHoldersGetTheirLayersEvents(t *testing.T) {
	var src layer.Events
	m := New(&src, false)
	x, y := &at{name: "+x"}, &at{name: "+y"}
	hx1, hx2, hy, hp := &recorder{}, &recorder{}, &recorder{}, &recorder{}
	m.Register(hx1, x)
	m.Register(hx2, x)
	vy := m.Register(hy, y)
	m.Register(hp, &plain{})

	src.Raise(layer.Event{Kind: layer.Entries, Name: "n"})
	src.Raise(layer.Event{Kind: layer.Entries, Name: "o", View: vy})

	for _, c := range []struct {
		h    *recorder
		want string
	}{{hx1, "[n+x o+x]"}, {hx2, "[n+x o+x]"}, {hy, "[n+y]"}, {hp, "[n o]"}} {
		if got := fmt.Sprint(c.h.got); got != c.want {
			t.Errorf("a holder got %s, want %s", got, c.want)
		}
	}
	if x.asked != 2 || y.asked != 1 {
		t.Errorf("translations asked for: %d at x, %d at y; want one per event each, none for the view that made it", x.asked, y.asked)
	}
}

// A change that found no handle of its file counts for a lookup that
// began before it, and only for that file; once the record of misses
// starts afresh, every lookup from before then counts as changed.
func TestHeldMissed(t *testing.T) {
	var h Held[int]
	a, b := layer.Token{Ino: 1, Gen: 1}, layer.Token{Ino: 2, Gen: 1}
	mark := h.Mark()
	if h.Changed(a, mark) {
		t.Fatal("nothing changed yet")
	}
	h.Missed(a)
	if !h.Changed(a, mark) || h.Changed(b, mark) {
		t.Fatalf("after a change of a: a %v, b %v", h.Changed(a, mark), h.Changed(b, mark))
	}
	if later := h.Mark(); h.Changed(a, later) {
		t.Fatal("a lookup begun after the change counts it")
	}
	for i := range maxMissed + 1 {
		h.Missed(layer.Token{Ino: uint64(100 + i), Gen: 1})
	}
	if !h.Changed(b, mark) {
		t.Fatal("a lookup from before forgotten misses is not taken as changed")
	}
}
