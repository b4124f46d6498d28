package objstore

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

func writeSuper(dev *device, sb *superblock) error {
	if _, err := dev.f.WriteAt(sb.encode(), 0); err != nil {
		return err
	}
	return dev.sync()
}

func readSuper(dev *device, buf []byte) (superblock, error) {
	if _, err := dev.f.ReadAt(buf, 0); err != nil {
		return superblock{}, err
	}
	return decodeSuper(buf)
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

// load restores the index a clean close saved, checking its checksum and
// that its objects lie inside the store without overlapping.
func (s *Store) load() error {
	sb := s.sb
	if sb.indexBytes%indexEntSize != 0 || sb.indexBlock+uint64(blocksFor(int64(sb.indexBytes))) > sb.blocks {
		return fmt.Errorf("%w: saved index lies outside the store", ErrCorrupt)
	}
	blob := make([]byte, sb.indexBytes)
	if _, err := s.dev.f.ReadAt(blob, int64(superBlocks+sb.indexBlock)*blockSize); err != nil {
		return err
	}
	if crc32.Checksum(blob, castagnoli) != sb.indexCRC {
		return fmt.Errorf("%w: saved index checksum mismatch", ErrCorrupt)
	}
	for p := blob; len(p) > 0; p = p[indexEntSize:] {
		e := entry{
			hash:  binary.LittleEndian.Uint64(p),
			block: binary.LittleEndian.Uint32(p[8:]),
			size:  binary.LittleEndian.Uint32(p[12:]),
		}
		nb := blocksFor(int64(e.size))
		if e.size <= headerSize || !s.alloc.isFree(e.block, nb) {
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
