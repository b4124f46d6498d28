package shard

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/shalefs/shale/crypt"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/rot13"
)

// recorder is a holder that keeps the events it is given.
type recorder struct {
	mu  sync.Mutex
	evs []layer.Event
}

func (r *recorder) Invalidate(ev layer.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

// entries returns the Entries events given so far.
func (r *recorder) entries() []layer.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var evs []layer.Event
	for _, ev := range r.evs {
		if ev.Kind == layer.Entries {
			evs = append(evs, ev)
		}
	}
	return evs
}

// about tells whether an event was given about tok.
func (r *recorder) about(tok layer.Token) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.evs {
		if ev.Token == tok {
			return true
		}
	}
	return false
}

// record registers a recorder with the test stack's manager, holding the
// stack at node at, until the test ends.
func record(t *testing.T, at layer.Node) *recorder {
	r := &recorder{}
	m := testStack.Manager()
	v := m.Register(r, at)
	t.Cleanup(func() { m.Unregister(v) })
	return r
}

// sameBucket gives a name, other than name and those in not, that lives
// in name's bucket.
func sameBucket(name string, not ...string) string {
	b, _ := place(name)
	for i := 0; ; i++ {
		n := fmt.Sprintf("x%d", i)
		if pb, _ := place(n); pb == b && n != name && !slices.Contains(not, n) {
			return n
		}
	}
}

// upper is what a holder of directory d calls the name of entry event
// ev, as a FUSE view does: the name itself if d's layer keeps names.
func upper(t *testing.T, d layer.Node, ev layer.Event) string {
	t.Helper()
	tr, ok := d.(layer.NameTranslator)
	if !ok {
		return ev.Name
	}
	name, ok := tr.UpperName(ctx, ev.Name)
	if !ok {
		t.Fatalf("%T.UpperName(%q) found no name", d, ev.Name)
	}
	return name
}

// Entries changed in a bucket beside the layer (through the layer beneath,
// as another view would) reach a holder of the layer as entries of the
// managed directory, by the names users see; the bucket's own events
// reach only holders beneath.
func TestBucketEventsAreTheDirectorys(t *testing.T) {
	_, root := newShard(t, true)
	hroot := root.(*node).Lower
	create(t, root, "a") // its bucket is cached
	b, _ := place("a")
	bucket := lookup(t, hroot, bucketName(b))
	one := sameBucket("a")
	two := sameBucket("a", one)
	above, beneath := record(t, root), record(t, hroot)

	create(t, bucket, one)
	must(t, bucket.Rename(ctx, one, bucket, two, 0), "rename")
	must(t, bucket.Unlink(ctx, two), "unlink")
	var a layer.Attr
	must(t, bucket.Setattr(ctx, nil, &layer.SetAttr{Valid: layer.SetMode, Mode: 0o700}, &a), "chmod")

	var got []string
	for _, ev := range above.entries() {
		if ev.Token != root.Token() {
			t.Errorf("an entry event about %v, want the managed directory's %v", ev.Token, root.Token())
		}
		got = append(got, upper(t, root, ev))
	}
	if want := []string{one, one, two, two}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("entry events above name %q, want %q", got, want)
	}
	if above.about(bucket.Token()) {
		t.Error("an event about a bucket reached a holder of the layer")
	}
	if len(beneath.entries()) != 4 || !beneath.about(bucket.Token()) {
		t.Errorf("beneath the layer, %d entry events, bucket's seen: %v; want 4, its own", len(beneath.entries()), beneath.about(bucket.Token()))
	}
}

// The managed directory's link count counts the directories in its
// buckets: one made beside the layer shows, once its event has passed
// through the layer, and after lost events (Everything) one made unseen
// shows too.
func TestLinkCountFollowsBuckets(t *testing.T) {
	dir, root := newShard(t, true)
	hroot := root.(*node).Lower
	create(t, root, "a")
	nlink := func() uint32 {
		var a layer.Attr
		must(t, root.Getattr(ctx, nil, &a), "getattr")
		return a.Nlink
	}
	if n := nlink(); n != 2 {
		t.Fatalf("link count %d, want 2", n)
	}
	record(t, root)
	b, _ := place("a")
	bucket := lookup(t, hroot, bucketName(b))
	first := sameBucket("a")
	var a layer.Attr
	d, e := bucket.Mkdir(ctx, first, 0o755, &a)
	must(t, e, "mkdir")
	d.Forget()
	if n := nlink(); n != 3 {
		t.Errorf("after a mkdir beside the layer, link count %d, want 3", n)
	}
	if err := os.Mkdir(filepath.Join(dir, bucketName(b), sameBucket("a", first)), 0o755); err != nil {
		t.Fatal(err)
	}
	testStack.Events().Raise(layer.Event{Kind: layer.Everything})
	if n := nlink(); n != 4 {
		t.Errorf("after lost events, link count %d, want 4", n)
	}
}

// Layers above shard pass the name of an event from a bucket down to
// shard, which names the entry as users see it (rot13 keeps names).
func TestNamesAboveShard(t *testing.T) {
	_, sroot := newShard(t, true)
	root, err := rot13.New(ctx, testStack, sroot)
	if err != nil {
		t.Fatal(err)
	}
	create(t, root, "a")
	b, _ := place("a")
	bucket := lookup(t, sroot.(*node).Lower, bucketName(b))
	above := record(t, root)
	one := sameBucket("a")
	create(t, bucket, one)
	evs := above.entries()
	if len(evs) != 1 || evs[0].Token != root.Token() {
		t.Fatalf("entry events above rot13: %v, want one about the managed directory %v", evs, root.Token())
	}
	if got := upper(t, root, evs[0]); got != one {
		t.Errorf("rot13 over shard calls the new entry %q, want %q", got, one)
	}
}

// Shard over a layer whose names depend on their directory (crypt): the
// name in an event from a bucket decodes only with that bucket.
func TestNamesBelowShard(t *testing.T) {
	lower := t.TempDir()
	hroot := hostfsOn(t, lower)
	if err := crypt.Init(ctx, hroot, lower, []byte("p"), crypt.Options{ScryptLogN: 10}); err != nil {
		t.Fatal(err)
	}
	l, err := crypt.Open(ctx, hroot, lower, []byte("p"))
	if err != nil {
		t.Fatal(err)
	}
	croot, err := l.Stack(ctx, testStack, hroot)
	if err != nil {
		t.Fatal(err)
	}
	root := shardOver(t, croot)
	var a layer.Attr
	m, e := root.Mkdir(ctx, "m", 0o755, &a)
	must(t, e, "mkdir")
	t.Cleanup(m.Forget)
	must(t, setMode(t, m, 0o755|syscall.S_ISUID), "mark")
	create(t, m, "a")
	b, _ := place("a")
	bucket := lookup(t, lookup(t, croot, "m"), bucketName(b))
	above := record(t, root)
	one := sameBucket("a")
	create(t, bucket, one)
	evs := above.entries()
	if len(evs) != 1 || evs[0].Token != m.Token() {
		t.Fatalf("entry events above shard: %v, want one about the managed directory %v", evs, m.Token())
	}
	if _, encoded, _ := strings.Cut(evs[0].Name, "/"); encoded == one {
		t.Fatalf("the event's name %q is not crypt's encoding", evs[0].Name)
	}
	if got := upper(t, m, evs[0]); got != one {
		t.Errorf("shard over crypt calls the new entry %q, want %q", got, one)
	}
	other := (b + 1) % nBuckets // never cached: no node to decode with
	_, encoded, _ := strings.Cut(evs[0].Name, "/")
	if name, ok := m.(layer.NameTranslator).UpperName(ctx, bucketName(other)+"/"+encoded); ok {
		t.Errorf("a name from a bucket the layer does not hold decodes, to %q", name)
	}
}
