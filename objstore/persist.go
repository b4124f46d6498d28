package objstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"slices"
)

func writeSuper(dev *device, sb *superblock) error {
	if _, err := dev.f.WriteAt(sb.encode(), 0); err != nil {
		return err
	}
	return dev.sync()
}

// readSuper reads and checks the superblock and, if the store was closed
// cleanly, the saved index (into sb.saved, for load). Every field is range
// checked against the device before it is used. A bad superblock is an
// error; a bad saved index is logged and dropped: the superblock comes back
// dirty, as after a crash, so Open starts with an empty index.
func readSuper(dev *device, buf []byte) (superblock, error) {
	if _, err := dev.f.ReadAt(buf, 0); err != nil {
		return superblock{}, err
	}
	sb, err := decodeSuper(buf)
	if err != nil {
		return superblock{}, err
	}
	// decodeSuper bounded blocks by 2^32, so this cannot overflow.
	if (sb.blocks+superBlocks)*blockSize > uint64(dev.size) {
		return superblock{}, fmt.Errorf("%w: superblock says %d data blocks, more than the device's %d bytes hold", ErrCorrupt, sb.blocks, dev.size)
	}
	if sb.state == stateClean {
		saved, err := readIndex(dev, &sb)
		if errors.Is(err, ErrCorrupt) {
			// The store is a cache: a bad index costs its objects, not
			// the store. Open treats it as after an unclean shutdown.
			slog.Default().Warn("objstore: dropped a corrupt saved index; every object is a miss and its space is reused",
				"store", dev.f.Name(), "err", err)
			sb.state = stateDirty
			sb.indexBlock, sb.indexBytes, sb.indexCRC = 0, 0, 0
			return sb, nil
		}
		if err != nil {
			return superblock{}, err
		}
		sb.saved = saved
	}
	return sb, nil
}

// readIndex reads the index a clean close saved and checks it whole before
// anything is loaded: its place and length, its checksum, and that every
// entry is an object inside the store, overlapping no other, under a key
// listed once. It allocates no more than the store's own index could need.
func readIndex(dev *device, sb *superblock) ([]byte, error) {
	if err := sb.checkIndex(); err != nil {
		return nil, err
	}
	blob := make([]byte, sb.indexBytes)
	if _, err := dev.f.ReadAt(blob, int64(superBlocks+sb.indexBlock)*blockSize); err != nil {
		return nil, fmt.Errorf("read the saved index: %w", err)
	}
	if crc32.Checksum(blob, castagnoli) != sb.indexCRC {
		return nil, fmt.Errorf("%w: saved index checksum mismatch", ErrCorrupt)
	}
	alloc := newAllocator(uint32(sb.blocks))
	hashes := make([]uint64, 0, len(blob)/indexEntSize)
	for p := blob; len(p) > 0; p = p[indexEntSize:] {
		e := decodeEntry(p)
		if err := checkEntry(e); err != nil {
			return nil, err
		}
		nb := blocksFor(int64(e.size))
		if !alloc.isFree(e.block, nb) {
			return nil, fmt.Errorf("%w: saved index entry at block %d (%d bytes) overlaps another or lies outside the store", ErrCorrupt, e.block, e.size)
		}
		alloc.take(e.block, nb)
		hashes = append(hashes, e.hash)
	}
	slices.Sort(hashes)
	for i := 1; i < len(hashes); i++ {
		if hashes[i] == hashes[i-1] {
			return nil, fmt.Errorf("%w: saved index lists a key twice", ErrCorrupt)
		}
	}
	return blob, nil
}

func decodeEntry(p []byte) entry {
	return entry{
		hash:  binary.LittleEndian.Uint64(p),
		block: binary.LittleEndian.Uint32(p[8:]),
		size:  binary.LittleEndian.Uint32(p[12:]),
	}
}

// save writes the index into free space and then marks the store clean.
// The order matters: objects first, index second, clean marker last, each
// made durable before the next, so a crash at any point leaves either the
// old dirty state (all misses) or a complete, checksummed index.
func (s *Store) save() error {
	if err := s.dev.sync(); err != nil {
		return err
	}
	var blob []byte
	var b uint32
	if s.idx.live > 0 {
		var err error
		// Evicting to make room only shrinks the index, so size it first.
		if b, err = s.place(blocksFor(int64(s.idx.live)*indexEntSize), 1); err != nil {
			return err
		}
		blob = make([]byte, 0, s.idx.live*indexEntSize)
		s.pol.Walk(func(id uint32) {
			e := s.idx.at(id)
			blob = binary.LittleEndian.AppendUint64(blob, e.hash)
			blob = binary.LittleEndian.AppendUint32(blob, e.block)
			blob = binary.LittleEndian.AppendUint32(blob, e.size)
		})
		if _, err := s.dev.f.WriteAt(blob, int64(superBlocks+b)*blockSize); err != nil {
			return err
		}
		if err := s.dev.sync(); err != nil {
			return err
		}
	}
	s.sb.state = stateClean
	s.sb.indexBlock = uint64(b)
	s.sb.indexBytes = uint64(len(blob))
	s.sb.indexCRC = crc32.Checksum(blob, castagnoli)
	s.sb.hits += s.hits.Swap(0)
	s.sb.misses += s.misses.Swap(0)
	return writeSuper(s.dev, &s.sb)
}

// load restores the index a clean close saved, which readSuper has read
// and checked. The checks here only guard against a caller that skipped it.
func (s *Store) load() error {
	blob := s.sb.saved
	s.sb.saved = nil
	if len(blob)%indexEntSize != 0 {
		return fmt.Errorf("%w: saved index is not whole entries", ErrCorrupt)
	}
	for p := blob; len(p) > 0; p = p[indexEntSize:] {
		e := decodeEntry(p)
		nb := blocksFor(int64(e.size))
		if checkEntry(e) != nil || !s.alloc.isFree(e.block, nb) {
			return fmt.Errorf("%w: saved index entry at block %d overlaps another or lies outside the store", ErrCorrupt, e.block)
		}
		if _, _, dup := s.idx.find(e.hash); dup {
			return fmt.Errorf("%w: saved index lists a key twice", ErrCorrupt)
		}
		s.alloc.take(e.block, nb)
		s.pol.Add(s.idx.insert(e))
	}
	s.alloc.cursor = 0
	return nil
}
