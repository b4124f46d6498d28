package objstore

import (
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestIndexMemory measures the in-memory cost of an object, index plus
// policy, with runtime.MemStats. The budget is 32 bytes.
func TestIndexMemory(t *testing.T) {
	const n = 1 << 20
	for _, count := range []int{n, n * 5 / 4, n * 3 / 2} { // sample along the table's growth cycle
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		idx := newIndex(1 << 22)
		pol := newSieve()
		rng := rand.New(rand.NewPCG(7, 8))
		for i := 0; i < count; i++ {
			pol.Add(idx.insert(entry{hash: rng.Uint64(), block: uint32(i), size: 1000}))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		per := float64(after.HeapAlloc-before.HeapAlloc) / float64(count)
		t.Logf("%d objects: %.1f bytes each (table load %.2f)", count, per, float64(idx.live)/float64(len(idx.table)))
		if per > 32 {
			t.Errorf("%d objects: %.1f bytes an object, budget 32", count, per)
		}
		runtime.KeepAlive(idx)
		runtime.KeepAlive(pol)
	}
}

// TestIndexOps checks lookups, removals (with backward shifts) and id reuse
// against a map, with a tiny id space so that the hint bits are many.
func TestIndexOps(t *testing.T) {
	idx := newIndex(5000)
	rng := rand.New(rand.NewPCG(9, 10))
	model := map[uint64]uint32{} // hash -> block
	for op := 0; op < 60000; op++ {
		h := rng.Uint64() % 8000
		id, pos, ok := idx.find(h)
		_, inModel := model[h]
		if ok != inModel {
			t.Fatalf("op %d: find(%d) = %v, model %v", op, h, ok, inModel)
		}
		switch {
		case ok && idx.at(id).block != model[h]:
			t.Fatalf("op %d: hash %d at block %d, want %d", op, h, idx.at(id).block, model[h])
		case ok:
			idx.remove(id, pos)
			delete(model, h)
		case len(model) < 4000:
			b := uint32(op)
			idx.insert(entry{hash: h, block: b, size: 100})
			model[h] = b
		}
	}
	if idx.live != len(model) {
		t.Fatalf("live %d, model %d", idx.live, len(model))
	}
}
