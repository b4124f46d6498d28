package objstore

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// Options tune a store.
type Options struct {
	// Policy names the replacement policy: "sieve" (the default) or "lru".
	Policy string

	// ReadOnly opens the store without writing to it: the file is opened
	// O_RDONLY, so a store the caller may only read can be read, and no
	// dirty marker, index, eviction or compaction is ever written. Create
	// and Remove return ErrReadOnly. Read-only openers share the store with
	// each other but not with an owner (see Open).
	ReadOnly bool
}

// ErrReadOnly is what Create and Remove return on a store opened ReadOnly.
var ErrReadOnly = errors.New("store is open read-only")

// MaxKeyLen is the longest key, in bytes.
const MaxKeyLen = maxKeyLen

// Store is a cache of immutable objects in one preallocated file or block
// device. All methods are safe for concurrent use. See the package comment
// for the design.
type Store struct {
	dev *device
	q   *queue
	def *Session

	mu     sync.Mutex // guards everything below
	idx    *index
	pol    Policy
	alloc  *allocator
	sb     superblock // counters as of open
	closed bool
	clean  bool // the index came from a clean close

	evictions, compactions, moved uint64

	hits, misses atomic.Uint64
}

// Format creates a store at path: a new file preallocated to size bytes, or
// a block device (all of it, or its first size bytes if size is non-zero).
func Format(path string, size int64, opts Options) (*Store, error) {
	if size < 0 {
		return nil, fmt.Errorf("negative store size %d", size)
	}
	if opts.ReadOnly {
		return nil, fmt.Errorf("format %s: %w", path, ErrReadOnly)
	}
	dev, err := openDevice(path, true, size)
	if err != nil {
		return nil, err
	}
	// A failure from here on removes the file openDevice created.
	blocks := dev.size/blockSize - superBlocks
	if blocks < 64 || blocks > int64(^uint32(0)) {
		dev.abandon()
		return nil, fmt.Errorf("store size %d bytes is out of range: use between 36 KiB and 2 TiB", dev.size)
	}
	sb := superblock{blocks: uint64(blocks)}
	if err := writeSuper(dev, &sb); err != nil {
		dev.abandon()
		return nil, err
	}
	s, err := newStore(dev, sb, opts)
	if err != nil {
		dev.abandon()
		return nil, err
	}
	return s, nil
}

// Open opens an existing store. If it was not closed cleanly, its index is
// gone and every object is a miss; the space is reused.
//
// One Store owns a store at a time: Open takes an exclusive flock on the
// file or device, which the kernel drops when the owner closes it or dies,
// even by SIGKILL. Opening a store that is in use, by another process or
// another Store in this one, fails at once with an *InUseError (ErrInUse)
// that names the holder. With Options.ReadOnly the lock is shared: any
// number of readers, but never a reader beside an owner, which would read
// an index the owner is changing.
func Open(path string, opts Options) (*Store, error) {
	mode := openRW
	if opts.ReadOnly {
		mode = openRO
	}
	dev, err := openDeviceMode(path, mode, 0)
	if err != nil {
		return nil, err
	}
	buf := make([]byte, superBlocks*blockSize)
	if dev.size < int64(len(buf)) {
		dev.close()
		return nil, fmt.Errorf("%s: %w: too small to hold a superblock", path, ErrCorrupt)
	}
	sb, err := readSuper(dev, buf)
	if err == nil && (sb.blocks+superBlocks)*blockSize > uint64(dev.size) {
		err = fmt.Errorf("%w: superblock says %d blocks, device is shorter", ErrCorrupt, sb.blocks)
	}
	if err != nil {
		dev.close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	s, err := newStore(dev, sb, opts)
	if err != nil {
		dev.close()
		return nil, err
	}
	if sb.state == stateClean {
		if err := s.load(); err != nil {
			s.q.close()
			dev.close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		s.clean = true
	}
	if opts.ReadOnly {
		return s, nil
	}
	// From here on a crash must not trust the index saved on disk.
	s.sb.state = stateDirty
	if err := writeSuper(dev, &s.sb); err != nil {
		s.q.close()
		dev.close()
		return nil, err
	}
	return s, nil
}

func newStore(dev *device, sb superblock, opts Options) (*Store, error) {
	pol, err := newPolicy(opts.Policy)
	if err != nil {
		return nil, err
	}
	n := uint32(sb.blocks)
	s := &Store{dev: dev, idx: newIndex(n), pol: pol, alloc: newAllocator(n), sb: sb}
	s.q = newQueue(dev)
	s.def = newSession(s)
	return s, nil
}

// NewSession returns a handle whose Sync waits only for its own writes.
func (s *Store) NewSession() *Session { return newSession(s) }

// Create stores data under key, replacing any object with that key. It
// returns once the object is indexed and its write queued; data must not
// change until Sync returns. Reads see the object at once.
func (s *Store) Create(key string, data []byte) error { return s.def.Create(key, data) }

// Sync waits for the writes submitted through Create (see Session.Sync).
func (s *Store) Sync() error { return s.def.Sync() }

// Create is Store.Create for this session.
func (c *Session) Create(key string, data []byte) error {
	s := c.st
	if s.dev.readOnly {
		return ErrReadOnly
	}
	if len(key) == 0 || len(key) > maxKeyLen {
		return fmt.Errorf("key of %d bytes: %w", len(key), ErrKeyLength)
	}
	size := diskSize(len(key), len(data))
	if size > int64(^uint32(0)) || int64(blocksFor(size)) > int64(s.alloc.n) {
		return fmt.Errorf("%d bytes: %w", len(data), ErrTooLarge)
	}
	h := keyHash(key)
	r := newRequest(key, h, data, size)
	r.sess = c
	s.q.waitRoom()

	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if id, pos, ok := s.idx.find(h); ok {
		s.drop(id, pos)
	}
	nb := blocksFor(size)
	b, err := s.place(nb, alignFor(size))
	if err != nil {
		return err
	}
	s.alloc.take(b, nb)
	s.pol.Add(s.idx.insert(entry{hash: h, block: b, size: uint32(size)}))
	r.block = b
	r.off = int64(superBlocks+b) * blockSize
	c.add()
	s.q.push(r)
	return nil
}

// Read returns the object stored under key, or ErrNotFound. Bytes that fail
// their checksum, or belong to another key, are a miss and leave the index.
// Reads are synchronous and run in the caller's goroutine: concurrent
// readers give the device its parallelism without a queue in between.
func (s *Store) Read(key string) ([]byte, error) { return s.read(key, nil) }

// ReadInto is Read into p, which must hold Length(key) bytes; it returns
// the length and may use all of p's capacity as scratch. A caller that reuses its buffer saves Read's allocation,
// which for objects of megabytes is also a first touch of fresh pages.
func (s *Store) ReadInto(key string, p []byte) (int, error) {
	data, err := s.read(key, p)
	if err != nil {
		return 0, err
	}
	if len(data) > len(p) {
		return 0, fmt.Errorf("%d-byte buffer for a %d-byte object: %w", len(p), len(data), io.ErrShortBuffer)
	}
	if len(data) > 0 && &data[0] != &p[0] {
		copy(p, data)
	}
	return len(data), nil
}

func (s *Store) read(key string, p []byte) ([]byte, error) {
	h := keyHash(key)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	id, _, ok := s.idx.find(h)
	if !ok {
		s.mu.Unlock()
		s.misses.Add(1)
		return nil, ErrNotFound
	}
	e := *s.idx.at(id)
	s.pol.Hit(id)
	s.mu.Unlock()

	if data, ok := s.q.pendingData(e.block, key); ok {
		s.hits.Add(1)
		return data, nil
	}
	data, err := s.readObject(key, e, p[:cap(p)])
	if errors.Is(err, errMismatch) {
		s.forget(e)
		s.misses.Add(1)
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	s.hits.Add(1)
	return data, nil
}

// Remove drops key from the store. It touches only memory.
func (s *Store) Remove(key string) error {
	if s.dev.readOnly {
		return ErrReadOnly
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	id, pos, ok := s.idx.find(keyHash(key))
	if !ok {
		return ErrNotFound
	}
	s.drop(id, pos)
	return nil
}

// Length returns the length of key's data without touching the disk.
func (s *Store) Length(key string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	id, _, ok := s.idx.find(keyHash(key))
	if !ok {
		return 0, ErrNotFound
	}
	return dataLen(s.idx.at(id).size, len(key)), nil
}

// drop removes an object from the index, the policy and the allocator.
func (s *Store) drop(id uint32, pos int) {
	e := s.idx.at(id)
	s.alloc.release(e.block, blocksFor(int64(e.size)))
	s.pol.Remove(id)
	s.idx.remove(id, pos)
}

// forget drops an object that failed verification, unless it has changed
// (moved, replaced) since it was read.
func (s *Store) forget(e entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, pos, ok := s.idx.find(e.hash); ok && *s.idx.at(id) == e {
		s.drop(id, pos)
	}
}

// Eviction keeps some free space spread over the store: compaction gathers
// a run by moving the live data it passes, so its cost per block gained is
// used/free, and at 1% free it would copy 99 blocks for each. A create that
// would leave less than evictLow free evicts until evictHigh is free; above
// that, scattered free space is compacted rather than evicting anything.
func (s *Store) evictLow() uint32  { return s.alloc.n / 32 }
func (s *Store) evictHigh() uint32 { return s.alloc.n / 16 }

// place finds nb contiguous free blocks aligned to align, evicting what the
// policy chooses when free space is short, and compacting when there is
// enough free space but no run long enough.
func (s *Store) place(nb, align uint32) (uint32, error) {
	for {
		if b, ok := s.alloc.find(nb, align); ok {
			return b, nil
		}
		if s.alloc.free < nb+s.evictLow() {
			for want := nb + s.evictHigh(); s.alloc.free < want && s.evict(); {
			}
			if b, ok := s.alloc.find(nb, align); ok {
				return b, nil
			}
		}
		if s.alloc.free >= nb {
			b, ok, err := s.compact(nb, align)
			if ok || err != nil {
				return b, err
			}
		}
		// Alignment gaps left compaction just short: make more room.
		if !s.evict() {
			return 0, fmt.Errorf("%d blocks: %w", nb, ErrTooLarge)
		}
	}
}

// evict drops the policy's next victim, if there is one.
func (s *Store) evict() bool {
	id, ok := s.pol.Victim()
	if !ok {
		return false
	}
	_, pos, _ := s.idx.find(s.idx.at(id).hash)
	s.drop(id, pos)
	s.evictions++
	return true
}

// Stats describe a store.
type Stats struct {
	Objects       int
	Capacity      int64   // bytes in the data area
	Used          int64   // bytes in blocks holding objects
	Free          int64   // Capacity - Used
	Largest       int64   // the longest free run in bytes
	Fragmentation float64 // 1 - Largest/Free: 0 when free space is one run
	Hits, Misses  uint64  // reads since the store was formatted
	Evictions     uint64  // since open
	Compactions   uint64  // since open
	MovedBytes    int64   // moved by compaction since open
	CleanOpen     bool    // the index survived from a clean close
}

// HitRatio is hits over reads, or 0 before the first read.
func (st Stats) HitRatio() float64 {
	if st.Hits+st.Misses == 0 {
		return 0
	}
	return float64(st.Hits) / float64(st.Hits+st.Misses)
}

// Stats reports the store's state.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	free := int64(s.alloc.free) * blockSize
	st := Stats{
		Objects:     s.idx.live,
		Capacity:    int64(s.alloc.n) * blockSize,
		Free:        free,
		Largest:     int64(s.alloc.largest()) * blockSize,
		Hits:        s.sb.hits + s.hits.Load(),
		Misses:      s.sb.misses + s.misses.Load(),
		Evictions:   s.evictions,
		Compactions: s.compactions,
		MovedBytes:  int64(s.moved) * blockSize,
		CleanOpen:   s.clean,
	}
	st.Used = st.Capacity - free
	if free > 0 {
		st.Fragmentation = 1 - float64(st.Largest)/float64(free)
	}
	return st
}

// Close waits for queued writes, saves the index and marks the store clean.
// A read-only store only closes its file. Either way the lock goes.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	s.q.drain()
	var err error
	if !s.dev.readOnly {
		err = s.save()
	}
	s.q.close()
	if cerr := s.dev.close(); err == nil {
		err = cerr
	}
	return err
}
