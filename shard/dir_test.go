package shard

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/shalefs/shale/layer"
)

// A listing of a managed directory sees every surviving entry once while
// another goroutine deletes and creates entries, and Seek to any offset
// it handed out resumes right after that entry, in this stream or a new
// one.
func TestReaddirConcurrentChangesAndSeek(t *testing.T) {
	_, root := newShard(t, true)
	const n = 3000
	for i := range n {
		create(t, root, fmt.Sprintf("f%04d", i))
	}
	s, e := root.OpenDir(ctx)
	must(t, e, "opendir")
	defer s.Close()
	seen := map[string]int{}
	var order []layer.DirEntry
	next := func() bool {
		ent, ok, e := s.Next(ctx)
		must(t, e, "next")
		if ok {
			seen[ent.Name]++
			order = append(order, ent)
		}
		return ok
	}
	for range 500 {
		next()
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < n; i += 2 {
			root.Unlink(ctx, fmt.Sprintf("f%04d", i))
			create(t, root, fmt.Sprintf("g%04d", i))
		}
	}()
	for next() {
	}
	wg.Wait()
	for i := 1; i < n; i += 2 {
		if name := fmt.Sprintf("f%04d", i); seen[name] != 1 {
			t.Errorf("%s seen %d times", name, seen[name])
		}
	}
	for name, c := range seen {
		if c > 1 {
			t.Errorf("%s seen %d times", name, c)
		}
	}

	// Now quiet: Seek to random offsets, in this stream and in a new one.
	full := listAll(t, root)
	r := rand.New(rand.NewPCG(1, 2))
	s2, e := root.OpenDir(ctx)
	must(t, e, "opendir")
	defer s2.Close()
	for range 50 {
		i := r.IntN(len(full))
		for _, st := range []layer.DirStream{s, s2} {
			must(t, st.Seek(ctx, full[i].Off), "seek")
			for j := i + 1; j < min(i+4, len(full)); j++ {
				ent, ok, e := st.Next(ctx)
				if e != 0 || !ok || ent.Name != full[j].Name {
					t.Fatalf("after Seek(%#x) to follow %q: got %q, %v, %v; want %q", full[i].Off, full[i].Name, ent.Name, ok, e, full[j].Name)
				}
			}
		}
	}
	// Seek(0) starts over and sees what was made since.
	create(t, root, "late")
	must(t, s.Seek(ctx, 0), "rewind")
	found := false
	for {
		ent, ok, e := s.Next(ctx)
		must(t, e, "next")
		if !ok {
			break
		}
		found = found || ent.Name == "late"
	}
	if !found {
		t.Error("rewound stream misses an entry made before the rewind")
	}
}

// listAll returns a whole listing, dots included, in stream order.
func listAll(t *testing.T, d layer.Node) []layer.DirEntry {
	t.Helper()
	s, e := d.OpenDir(ctx)
	must(t, e, "opendir")
	defer s.Close()
	var out []layer.DirEntry
	for {
		ent, ok, e := s.Next(ctx)
		must(t, e, "next")
		if !ok {
			return out
		}
		if len(out) > 0 && ent.Off <= out[len(out)-1].Off {
			t.Fatalf("offsets not increasing at %q", ent.Name)
		}
		out = append(out, ent)
	}
}
