package objstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cespare/xxhash/v2"
)

// The store is an array of 512-byte blocks. Block numbers in the index are
// relative to the data area, which starts after the superblock.
const (
	blockSize    = 512
	superBlocks  = 8 // the superblock area: 4 KiB, one page
	version      = 1
	headerSize   = 24
	maxKeyLen    = blockSize - headerSize // header and key always fit in one block
	directMin    = 256 << 10              // objects this big are written with O_DIRECT
	pageSize     = 4096                   // large objects start, and keep their data, page aligned
	pageBlocks   = pageSize / blockSize
	flagAligned  = 1          // data starts one page into the object
	objectMagic  = 0x6f534643 // "CFSo"
	superSize    = 80
	stateDirty   = 0
	stateClean   = 1
	indexEntSize = 16
	minBlocks    = 64        // data blocks in the smallest store Format makes
	maxBlocks    = 1<<32 - 1 // block numbers are uint32
)

var superMagic = [8]byte{'S', 'H', 'A', 'L', 'E', 'C', 'F', 'S'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors a caller can test for with errors.Is.
var (
	ErrNotFound  = errors.New("object not found")
	ErrCorrupt   = errors.New("corrupt store")
	ErrKeyLength = fmt.Errorf("a key must be 1 to %d bytes long", maxKeyLen)
	ErrTooLarge  = errors.New("object larger than the store")
	ErrClosed    = errors.New("store is closed")
)

func keyHash(key string) uint64 { return xxhash.Sum64String(key) }

// diskSize is the number of bytes an object occupies on disk, the "size" the
// index keeps. Small objects are packed (header, key, data); large ones
// start on a page and put their data one page in, so it moves by direct I/O
// in whole pages without a copy. The two size ranges do not overlap, so the
// size alone tells which layout an object has.
func diskSize(keyLen, dataLen int) int64 {
	if dataLen >= directMin {
		return pageSize + int64(dataLen)
	}
	return int64(headerSize + keyLen + dataLen)
}

// aligned reports whether an object of the given disk size uses the aligned layout.
func aligned(size uint32) bool { return size >= pageSize+directMin }

// dataLen recovers an object's length from its disk size and key.
func dataLen(size uint32, keyLen int) int {
	if aligned(size) {
		return int(size) - pageSize
	}
	return int(size) - headerSize - keyLen
}

func blocksFor(size int64) uint32 { return uint32((size + blockSize - 1) / blockSize) }

// alignFor is the block alignment an object of the given disk size needs.
func alignFor(size int64) uint32 {
	if size >= pageSize+directMin {
		return pageBlocks
	}
	return 1
}

func alignUp(b, align uint32) uint32 { return (b + align - 1) &^ (align - 1) }

// header is the on-disk object header. The CRC covers the header (with the
// CRC field zero), the key and the data, so a read can tell a stale or torn
// object, or another key's object, from the one it asked for.
type header struct {
	keyLen  uint16
	flags   uint16
	dataLen uint32
	crc     uint32
	hash    uint64
}

func (h *header) encode(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], objectMagic)
	binary.LittleEndian.PutUint16(b[4:], h.keyLen)
	binary.LittleEndian.PutUint16(b[6:], h.flags)
	binary.LittleEndian.PutUint32(b[8:], h.dataLen)
	binary.LittleEndian.PutUint32(b[12:], h.crc)
	binary.LittleEndian.PutUint64(b[16:], h.hash)
}

func decodeHeader(b []byte) (header, bool) {
	if len(b) < headerSize || binary.LittleEndian.Uint32(b) != objectMagic {
		return header{}, false
	}
	return header{
		keyLen:  binary.LittleEndian.Uint16(b[4:]),
		flags:   binary.LittleEndian.Uint16(b[6:]),
		dataLen: binary.LittleEndian.Uint32(b[8:]),
		crc:     binary.LittleEndian.Uint32(b[12:]),
		hash:    binary.LittleEndian.Uint64(b[16:]),
	}, true
}

// objectCRC checksums an encoded header (its CRC field is treated as zero),
// the key and the data.
func objectCRC(hdr []byte, key string, data []byte) uint32 {
	var h [headerSize]byte
	copy(h[:], hdr[:headerSize])
	binary.LittleEndian.PutUint32(h[12:], 0)
	c := crc32.Update(0, castagnoli, h[:])
	c = crc32.Update(c, castagnoli, []byte(key))
	return crc32.Update(c, castagnoli, data)
}

// superblock is block 0. It holds the geometry, the clean marker, where a
// clean close left the index, and the hit counters.
type superblock struct {
	blocks     uint64 // data blocks
	state      uint32
	indexBlock uint64
	indexBytes uint64
	indexCRC   uint32
	hits       uint64
	misses     uint64

	// saved is the saved index, read and checked by readSuper for a clean
	// store and consumed by load; it is not part of the encoding.
	saved []byte
}

func (s *superblock) encode() []byte {
	b := make([]byte, superBlocks*blockSize)
	copy(b, superMagic[:])
	le := binary.LittleEndian
	le.PutUint32(b[8:], version)
	le.PutUint32(b[12:], blockSize)
	le.PutUint64(b[16:], s.blocks)
	le.PutUint32(b[24:], s.state)
	le.PutUint64(b[32:], s.indexBlock)
	le.PutUint64(b[40:], s.indexBytes)
	le.PutUint32(b[48:], s.indexCRC)
	le.PutUint64(b[56:], s.hits)
	le.PutUint64(b[64:], s.misses)
	le.PutUint32(b[76:], crc32.Checksum(b[:76], castagnoli))
	return b
}

func decodeSuper(b []byte) (superblock, error) {
	le := binary.LittleEndian
	if len(b) < superSize || [8]byte(b[:8]) != superMagic {
		return superblock{}, fmt.Errorf("%w: no shale object store superblock", ErrCorrupt)
	}
	if crc32.Checksum(b[:76], castagnoli) != le.Uint32(b[76:]) {
		return superblock{}, fmt.Errorf("%w: superblock checksum mismatch", ErrCorrupt)
	}
	if v := le.Uint32(b[8:]); v != version {
		return superblock{}, fmt.Errorf("%w: unsupported format version %d", ErrCorrupt, v)
	}
	if bs := le.Uint32(b[12:]); bs != blockSize {
		return superblock{}, fmt.Errorf("%w: block size %d, want %d", ErrCorrupt, bs, blockSize)
	}
	// Range-check the geometry in its own type before anything converts it:
	// a block count past uint32 would wrap, and one past 2^55 would wrap
	// the byte count it is checked against.
	if n := le.Uint64(b[16:]); n < minBlocks || n > maxBlocks {
		return superblock{}, fmt.Errorf("%w: superblock says %d data blocks, outside %d to %d", ErrCorrupt, n, minBlocks, uint64(maxBlocks))
	}
	if st := le.Uint32(b[24:]); st != stateDirty && st != stateClean {
		return superblock{}, fmt.Errorf("%w: superblock state %d is neither dirty (0) nor clean (1)", ErrCorrupt, st)
	}
	return superblock{
		blocks:     le.Uint64(b[16:]),
		state:      le.Uint32(b[24:]),
		indexBlock: le.Uint64(b[32:]),
		indexBytes: le.Uint64(b[40:]),
		indexCRC:   le.Uint32(b[48:]),
		hits:       le.Uint64(b[56:]),
		misses:     le.Uint64(b[64:]),
	}, nil
}

// checkIndex range-checks where the superblock says the saved index lies,
// in uint64 and before any of it is converted: a whole number of entries,
// no more entries than data blocks (each object takes at least one), and
// all of it inside the data area.
func (s *superblock) checkIndex() error {
	switch {
	case s.indexBytes%indexEntSize != 0:
		return fmt.Errorf("%w: saved index of %d bytes is not a whole number of %d-byte entries", ErrCorrupt, s.indexBytes, indexEntSize)
	case s.indexBytes/indexEntSize > s.blocks:
		return fmt.Errorf("%w: saved index of %d entries is more than the store's %d blocks could hold", ErrCorrupt, s.indexBytes/indexEntSize, s.blocks)
	case s.indexBlock >= s.blocks || s.blocks-s.indexBlock < (s.indexBytes+blockSize-1)/blockSize:
		return fmt.Errorf("%w: saved index at block %d (%d bytes) lies outside the store's %d blocks", ErrCorrupt, s.indexBlock, s.indexBytes, s.blocks)
	}
	return nil
}

// checkEntry range-checks one saved index entry, whose blocks the caller
// still checks against the allocator (inside the store, no overlap).
func checkEntry(e entry) error {
	switch {
	case e.size <= headerSize:
		return fmt.Errorf("%w: saved index entry at block %d has size %d, too small for an object", ErrCorrupt, e.block, e.size)
	case !aligned(e.size) && e.size >= headerSize+maxKeyLen+directMin:
		return fmt.Errorf("%w: saved index entry at block %d has size %d, which neither layout can have", ErrCorrupt, e.block, e.size)
	case e.block%alignFor(int64(e.size)) != 0:
		return fmt.Errorf("%w: saved index entry at block %d is a large object not on a page", ErrCorrupt, e.block)
	}
	return nil
}
