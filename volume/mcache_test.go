package volume

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// countingEngine counts the requests a client sends to etcd.
type countingEngine struct {
	Engine
	reads, txns atomic.Int64 // reads outside transactions; commits
	txReads     atomic.Int64 // reads inside transactions
}

func (c *countingEngine) Get(ctx context.Context, k string) ([]byte, error) {
	c.reads.Add(1)
	return c.Engine.Get(ctx, k)
}

func (c *countingEngine) Read(ctx context.Context, k ...string) ([]Value, int64, error) {
	c.reads.Add(1)
	return c.Engine.Read(ctx, k...)
}

func (c *countingEngine) List(ctx context.Context, p string, l int) ([]KV, int64, error) {
	c.reads.Add(1)
	return c.Engine.List(ctx, p, l)
}

func (c *countingEngine) Txn(ctx context.Context, fn func(Tx) error) (int64, error) {
	c.txns.Add(1)
	return c.Engine.Txn(ctx, func(tx Tx) error { return fn(&countingTx{tx, c}) })
}

type countingTx struct {
	Tx
	c *countingEngine
}

func (t *countingTx) Get(k ...string) ([][]byte, error) {
	t.c.txReads.Add(1)
	return t.Tx.Get(k...)
}

func (t *countingTx) Read(k ...string) ([]Value, error) {
	t.c.txReads.Add(1)
	return t.Tx.Read(k...)
}

// take returns the counts since the last call, as "reads/txns/txreads".
func (c *countingEngine) take() (reads, txns, txReads int64) {
	return c.reads.Swap(0), c.txns.Swap(0), c.txReads.Swap(0)
}

// countedMount opens lower as a client whose requests are counted, and
// waits until its metadata cache answers (its watch caught up).
func countedMount(t *testing.T, lower string) (*FS, layer.Node, *countingEngine) {
	t.Helper()
	u, err := ParseURL(lower)
	if err != nil {
		t.Fatal(err)
	}
	eng, err := DialEtcd(context.Background(), u.Etcd)
	if err != nil {
		t.Fatal(err)
	}
	ce := &countingEngine{Engine: eng}
	fs, err := openOn(context.Background(), stack.New(stack.Options{}), ce, u.Name, Options{})
	if err != nil {
		eng.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	for deadline := time.Now().Add(60 * time.Second); !fs.meta.answers(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watch did not catch up within 60s")
		}
	}
	return fs, &rootNode{node{fs: fs, ino: rootIno}}, ce
}

// TestMetadataRoundTrips: with the watch caught up, a create and a remove
// are one etcd transaction each and read nothing before it; a stat, a
// lookup and a listing send nothing; and another client's changes show
// in them within the watch's delivery.
func TestMetadataRoundTrips(t *testing.T) {
	lower := testVolume(t, bs)
	_, root, ce := countedMount(t, lower)
	var a layer.Attr
	dir, e := root.Mkdir(ctx0, "d", 0o755, &a)
	must(t, e)
	const n = 20
	ce.take()
	for i := range n {
		name := fmt.Sprintf("f%02d", i)
		if _, e := dir.Lookup(ctx0, name, &a); e != syscall.ENOENT {
			t.Fatalf("lookup %s before its create: %v", name, e)
		}
		_, h, e := dir.Create(ctx0, name, syscall.O_WRONLY, 0o644, &a)
		must(t, e)
		must(t, h.Flush(ctx0, 1))
		must(t, h.Release(ctx0))
	}
	if r, x, xr := ce.take(); r != 0 || x != n || xr != 0 {
		t.Errorf("%d creates (each after a lookup): %d reads, %d transactions, %d reads in them; want 0, %d, 0", n, r, x, xr, n)
	}
	for i := range n {
		c := lookup(t, dir, fmt.Sprintf("f%02d", i))
		attr(t, c)
		// As the kernel asks before each write.
		if _, e := c.Getxattr(ctx0, "security.capability", nil); e != syscall.ENODATA {
			t.Fatalf("getxattr of a new file: %v, want ENODATA", e)
		}
	}
	if ents := listNames(t, dir); len(ents) != n {
		t.Errorf("listed %d entries, want %d", len(ents), n)
	}
	if r, x, _ := ce.take(); r != 0 || x > 1 { // the listing may set atime
		t.Errorf("%d lookups, stats and getxattrs and a listing: %d reads, %d transactions; want none", n, r, x)
	}
	for i := range n {
		must(t, dir.Unlink(ctx0, fmt.Sprintf("f%02d", i)))
	}
	if r, x, xr := ce.take(); r != 0 || x != n || xr != 0 {
		t.Errorf("%d removes: %d reads, %d transactions, %d reads in them; want 0, %d, 0", n, r, x, xr, n)
	}

	// Another client's create, rename and remove reach the cache.
	_, root2 := mount(t, lower)
	dir2 := lookup(t, root2, "d")
	writeFile(t, dir2, "other", []byte("from the other client"))
	waitName(t, dir, "other", true)
	other := lookup(t, dir, "other")
	if _, e := other.Getxattr(ctx0, "user.k", nil); e != syscall.ENODATA {
		t.Fatalf("getxattr user.k: %v, want ENODATA", e)
	}
	must(t, lookup(t, dir2, "other").Setxattr(ctx0, "user.k", []byte("v"), 0))
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		buf := make([]byte, 8)
		if k, e := other.Getxattr(ctx0, "user.k", buf); e == 0 && string(buf[:k]) == "v" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the other client's setxattr did not show within 60s")
		}
	}
	must(t, dir2.Rename(ctx0, "other", dir2, "moved", 0))
	waitName(t, dir, "moved", true)
	waitName(t, dir, "other", false)
	if got := string(readFile(t, lookup(t, dir, "moved"))); got != "from the other client" {
		t.Errorf("read %q after the other client's rename", got)
	}
	must(t, dir2.Unlink(ctx0, "moved"))
	waitName(t, dir, "moved", false)
	if ents := listNames(t, dir); len(ents) != 0 {
		t.Errorf("listed %v after the other client removed all", ents)
	}
}

// waitName polls until name in dir is there (want) or not.
func waitName(t *testing.T, dir layer.Node, name string, want bool) {
	t.Helper()
	var a layer.Attr
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, e := dir.Lookup(ctx0, name, &a)
		if e != 0 && e != syscall.ENOENT {
			t.Fatalf("lookup %s: %v", name, e)
		}
		if (e == 0) == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: there %v after 60s, want %v", name, e == 0, want)
		}
	}
}

// listNames is dir's entries but "." and "..".
func listNames(t *testing.T, dir layer.Node) []string {
	t.Helper()
	ds, e := dir.OpenDir(ctx0)
	must(t, e)
	defer ds.Close()
	return drainNames(t, ds)
}

// drainNames reads ds to its end: its names but "." and "..".
func drainNames(t *testing.T, ds layer.DirStream) []string {
	t.Helper()
	var names []string
	for {
		d, ok, e := ds.Next(ctx0)
		must(t, e)
		if !ok {
			break
		}
		if d.Name != "." && d.Name != ".." {
			names = append(names, d.Name)
		}
	}
	return names
}

// TestCacheUnderChurn: one client creates, renames and removes names at
// random while another looks them up and lists them; once the first
// stops, the second's answers (from its cache) come to what etcd holds,
// read by a third client, and stay so.
func TestCacheUnderChurn(t *testing.T) {
	lower := testVolume(t, bs)
	_, ra := mount(t, lower)
	fb, rb, _ := countedMount(t, lower)
	var a layer.Attr
	da, e := ra.Mkdir(ctx0, "d", 0o755, &a)
	must(t, e)
	waitName(t, rb, "d", true)
	db := lookup(t, rb, "d")
	names := make([]string, 12)
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // the reader: lookups and listings throughout
		defer close(done)
		var a layer.Attr
		for {
			select {
			case <-stop:
				return
			default:
			}
			db.Lookup(ctx0, names[rand.IntN(len(names))], &a)
			if ds, e := db.OpenDir(ctx0); e == 0 {
				for _, ok, _ := ds.Next(ctx0); ok; _, ok, _ = ds.Next(ctx0) {
				}
				ds.Close()
			}
		}
	}()
	for range 300 {
		x, y := names[rand.IntN(len(names))], names[rand.IntN(len(names))]
		switch rand.IntN(4) {
		case 0, 1:
			if _, h, e := da.Create(ctx0, x, syscall.O_WRONLY|syscall.O_TRUNC, 0o644, &a); e == 0 {
				h.Write(ctx0, []byte(x), 0)
				h.Flush(ctx0, 1)
				h.Release(ctx0)
			}
		case 2:
			da.Rename(ctx0, x, da, y, 0)
		case 3:
			da.Unlink(ctx0, x)
		}
	}
	close(stop)
	<-done

	// The truth, as a client that has read nothing before sees it.
	_, rc := mount(t, lower)
	truth := listNames(t, lookup(t, rc, "d"))
	slices.Sort(truth)
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := listNames(t, db)
		slices.Sort(got)
		if slices.Equal(got, truth) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watching client lists %v, etcd holds %v", got, truth)
		}
	}
	if !fb.meta.answers() {
		t.Fatal("the cache does not answer: the check above read etcd")
	}
	for range 3 {
		for _, nm := range names {
			var a layer.Attr
			c, e := db.Lookup(ctx0, nm, &a)
			if want := slices.Contains(truth, nm); (e == 0) != want {
				t.Fatalf("lookup %s: %v, want there %v", nm, e, want)
			}
			if e == 0 {
				if got := string(readFile(t, c)); got == "" || !slices.Contains(names, got) {
					t.Fatalf("%s reads %q", nm, got)
				}
			}
		}
	}
}

// TestMcacheOrder: what the cache keeps of reads and watched changes
// follows their revisions, whatever order they come in, and nothing is
// answered while the watch is not caught up.
func TestMcacheOrder(t *testing.T) {
	k := newKeys("v")
	var c mcache
	c.reset()
	key := k.inode(5)
	if _, ok := c.get(k, key); ok {
		t.Fatal("answered before the watch was live")
	}
	c.await("m1")
	c.marked("m0")
	c.read(k, 10, []string{key}, []Value{{Val: []byte("r10"), Mod: 9}})
	if _, ok := c.get(k, key); ok {
		t.Fatal("answered before the sync mark came")
	}
	c.marked("m1")
	if v, ok := c.get(k, key); !ok || string(v.Val) != "r10" {
		t.Fatalf("got %q %v, want the read", v.Val, ok)
	}
	c.change(k, Change{Key: key, Val: []byte("w8"), Rev: 8}) // older than the read
	if v, _ := c.get(k, key); string(v.Val) != "r10" {
		t.Fatalf("an older change replaced a later read: %q", v.Val)
	}
	c.change(k, Change{Key: key, Val: []byte("w12"), Rev: 12})
	if v, _ := c.get(k, key); string(v.Val) != "w12" || v.Mod != 12 {
		t.Fatalf("got %q mod %d, want the change of 12", v.Val, v.Mod)
	}
	c.read(k, 11, []string{key}, []Value{{Val: []byte("r11"), Mod: 11}}) // the watch is past it
	if v, _ := c.get(k, key); string(v.Val) != "w12" {
		t.Fatalf("a read older than the watch replaced its change: %q", v.Val)
	}
	other := k.inode(6)
	c.read(k, 11, []string{other}, []Value{{Val: []byte("r11")}})
	if _, ok := c.get(k, other); ok {
		t.Fatal("kept a read made before a change the watch delivered")
	}
	c.change(k, Change{Key: key, Rev: 13}) // deleted
	if v, ok := c.get(k, key); !ok || v.Val != nil {
		t.Fatalf("got %q %v, want known absent", v.Val, ok)
	}
	c.down()
	if _, ok := c.get(k, key); ok {
		t.Fatal("answered while the watch is down")
	}
}

// TestOlderVersionIgnored: an open file takes no older version of its
// inode than it has, whether a lagging watch delivers it (refresh) or
// another open read it before (acquire): a reader would read old bytes.
func TestOlderVersionIgnored(t *testing.T) {
	lower := testVolume(t, bs)
	_, ra := mount(t, lower)
	fb, rb := mount(t, lower)
	writeFile(t, ra, "f", []byte("version one"))
	nb := lookup(t, rb, "f")
	ino := attr(t, nb).Ino
	old, _, err := fb.readInode(ctx0, ino)
	if err != nil {
		t.Fatal(err)
	}
	fa := lookup(t, ra, "f")
	rewrite(t, fa, []byte("version two!"))

	hb, e := nb.Open(ctx0, 0) // reads the inode: version two
	must(t, e)
	defer hb.Release(ctx0)
	fb.refresh(ino, old) // the watch, late
	if _, e := fb.acquire(ctx0, ino, old); e != 0 {
		t.Fatal(e)
	} else {
		defer fb.release(fb.openFile(ino))
	}
	buf := make([]byte, 64)
	k, e := hb.Read(ctx0, buf, 0)
	must(t, e)
	if got := string(buf[:k]); got != "version two!" {
		t.Fatalf("read %q after an older version came late, want %q", got, "version two!")
	}
}

// TestCachedValuesCopied: the cache keeps no caller's buffer. go-fuse
// reuses the buffer a setxattr's value came in; a value kept by
// reference reads back as whatever the next request put there.
func TestCachedValuesCopied(t *testing.T) {
	lower := testVolume(t, bs)
	_, root, _ := countedMount(t, lower)
	f := writeFile(t, root, "f", nil)
	buf := []byte("hello\x00world")
	must(t, f.Setxattr(ctx0, "user.b", buf, 0))
	copy(buf, "XXXXX") // the caller's buffer, reused
	got := make([]byte, 100)
	k, e := f.Getxattr(ctx0, "user.b", got)
	must(t, e)
	if string(got[:k]) != "hello\x00world" {
		t.Fatalf("getxattr after the setter's buffer changed: %q, want %q", got[:k], "hello\x00world")
	}
}

// A listing opened before another client's create, and read after the
// watch brought the create, shows it: the kernel, told of the change
// between its OPENDIR and its READDIR, fetches the new mtime first, and
// would keep a listing read at the open as the one of that mtime until
// the next change (TestTwoMountsChurn: names missing for 60 s).
func TestListingOpenedBeforeChange(t *testing.T) {
	lower := testVolume(t, bs)
	_, ra := mount(t, lower)
	_, rb := mount(t, lower)
	ds, e := ra.OpenDir(ctx0)
	must(t, e)
	defer ds.Close()
	writeFile(t, rb, "new", []byte("x"))
	waitName(t, ra, "new", true)
	if names := drainNames(t, ds); !slices.Contains(names, "new") {
		t.Fatalf("a stream opened before the other client's create, read after the watch brought it, listed %q", names)
	}
}
