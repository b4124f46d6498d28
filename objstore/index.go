package objstore

import "math/bits"

// entry is everything the store keeps in memory about one object: 16 bytes.
// The key itself lives only on disk, in the object header.
type entry struct {
	hash  uint64 // 64-bit hash of the key
	block uint32 // first block in the data area; the free-list link for unused ids
	size  uint32 // bytes on disk (see diskSize)
}

const (
	maxLoadNum, maxLoadDen = 4, 5 // grow past 80% full...
	growNum, growDen       = 3, 2 // ...by half: the load stays within 53-80%
	minTable               = 64
)

// index maps key hashes to objects. Objects get small dense ids (reused
// after removal) so that the replacement policy can keep its own per-object
// state in arrays instead of maps.
//
// The table is open-addressed with linear probing. Each 32-bit slot holds the
// id plus a hint: as many high bits of the hash as the id leaves room for.
// A probe compares the hint first and touches the entry only when it
// matches, which is the paper's integer key in front of the full compare.
type index struct {
	entries  chunked[entry]
	nextID   uint32 // ids handed out so far
	freeID   uint32 // head of the free-id list, plus one; 0 when empty
	table    []uint32
	live     int
	idBits   uint
	hintBits uint
}

// newIndex sizes the slot layout for at most maxObjects objects.
func newIndex(maxObjects uint32) *index {
	idBits := uint(bits.Len32(maxObjects + 1))
	if maxObjects+1 == 0 { // 2^32-1 objects: ids take the whole slot
		idBits = 32
	}
	return &index{table: make([]uint32, minTable), idBits: idBits, hintBits: 32 - idBits}
}

func (x *index) home(h uint64, n int) int { return int(uint64(uint32(h)) * uint64(n) >> 32) }

func (x *index) hint(h uint64) uint32 {
	if x.hintBits == 0 {
		return 0
	}
	return uint32(h>>(64-x.hintBits)) << x.idBits
}

func (x *index) idMask() uint32 { return uint32(1<<x.idBits - 1) }

func (x *index) at(id uint32) *entry { return x.entries.at(id) }

// find returns the id of the object with hash h and its table position.
func (x *index) find(h uint64) (id uint32, pos int, ok bool) {
	want, mask := x.hint(h), x.idMask()
	for i := x.home(h, len(x.table)); ; i++ {
		if i == len(x.table) {
			i = 0
		}
		s := x.table[i]
		if s == 0 {
			return 0, 0, false
		}
		if s&^mask == want {
			if id := s&mask - 1; x.entries.at(id).hash == h {
				return id, i, true
			}
		}
	}
}

// insert adds an object whose hash is not in the index and returns its id.
func (x *index) insert(e entry) uint32 {
	if (x.live+1)*maxLoadDen > len(x.table)*maxLoadNum {
		x.resize(len(x.table) * growNum / growDen)
	}
	var id uint32
	if x.freeID != 0 {
		id = x.freeID - 1
		x.freeID = x.entries.at(id).block
	} else {
		id = x.nextID
		x.nextID++
		x.entries.grow(id)
	}
	*x.entries.at(id) = e
	x.place(x.table, id)
	x.live++
	return id
}

func (x *index) place(table []uint32, id uint32) {
	h := x.entries.at(id).hash
	i := x.home(h, len(table))
	for table[i] != 0 {
		if i++; i == len(table) {
			i = 0
		}
	}
	table[i] = x.hint(h) | (id + 1)
}

func (x *index) resize(n int) {
	t := make([]uint32, n)
	mask := x.idMask()
	for _, s := range x.table {
		if s != 0 {
			x.place(t, s&mask-1)
		}
	}
	x.table = t
}

// remove deletes the object at table position pos and frees its id. Linear
// probing needs no tombstones: later members of the probe run shift back.
func (x *index) remove(id uint32, pos int) {
	n, mask := len(x.table), x.idMask()
	i := pos
	for j := (i + 1) % n; x.table[j] != 0; j = (j + 1) % n {
		h := x.entries.at(x.table[j]&mask - 1).hash
		k := x.home(h, n)
		// Move slot j back to i unless its home lies cyclically in (i, j].
		if (i <= j && (k <= i || k > j)) || (i > j && k <= i && k > j) {
			x.table[i] = x.table[j]
			i = j
		}
	}
	x.table[i] = 0
	x.entries.at(id).block = x.freeID
	x.entries.at(id).hash = 0
	x.freeID = id + 1
	x.live--
}
