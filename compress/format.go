package compress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cespare/xxhash/v2"
)

// The on-disk format (docs/compress.md has it with known-answer vectors).
// A non-empty lower file starts with a 64-byte header; the table it names
// holds one 32-byte entry per logical block, each naming the block's
// stored extent. An empty lower file is an empty file; a non-empty one
// without a sound header is a plain file, served as it is.
const (
	headerSize = 64
	entrySize  = 32
	version    = 1
	blockShift = 16 // 64 KiB logical blocks
	blockSize  = 1 << blockShift
)

// magic starts every compressed lower file. The PNG-style bytes (high
// bit, CR LF, ^Z, LF) are in no text file.
var magic = [8]byte{0x89, 'S', 'H', 'Z', '\r', '\n', 0x1a, '\n'}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// header is the decoded header of a compressed file.
type header struct {
	size     uint64 // logical size
	tableOff uint64 // where the table starts in the lower file
	tableCap uint64 // entries the table has room for; blocks past it are holes
}

// encode gives the 64 header bytes:
//
//	0  magic (8)   8 version (2, BE)   10 block shift (1)   11..16 zero
//	16 size (8)   24 table offset (8)   32 table capacity (4)   36..60 zero
//	60 CRC32C of bytes 0..60 (4)
func (h header) encode() []byte {
	b := make([]byte, headerSize)
	copy(b, magic[:])
	binary.BigEndian.PutUint16(b[8:], version)
	b[10] = blockShift
	binary.BigEndian.PutUint64(b[16:], h.size)
	binary.BigEndian.PutUint64(b[24:], h.tableOff)
	binary.BigEndian.PutUint32(b[32:], uint32(h.tableCap))
	binary.BigEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
	return b
}

// errPlain says that a lower file does not start with the magic: it is a
// plain file, not one of the layer's.
var errPlain = errors.New("no compress header")

// maxSize bounds the logical size so that block numbers and the table's
// extent stay far from overflow (and below the largest file offset).
const maxSize = 1 << 62

// decodeHeader checks and decodes a header. A file without the magic is
// plain (errPlain); one with the magic and anything wrong is damaged.
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize || [8]byte(b[:8]) != magic {
		return header{}, errPlain
	}
	if crc32.Checksum(b[:60], castagnoli) != binary.BigEndian.Uint32(b[60:]) {
		return header{}, errors.New("header checksum mismatch")
	}
	if v := binary.BigEndian.Uint16(b[8:]); v != version {
		return header{}, fmt.Errorf("unknown format version %d", v)
	}
	if b[10] != blockShift {
		return header{}, fmt.Errorf("block shift %d, want %d", b[10], blockShift)
	}
	h := header{
		size:     binary.BigEndian.Uint64(b[16:]),
		tableOff: binary.BigEndian.Uint64(b[24:]),
		tableCap: uint64(binary.BigEndian.Uint32(b[32:])),
	}
	switch {
	case h.size > maxSize:
		return header{}, fmt.Errorf("size %d out of range", h.size)
	case h.tableOff < headerSize || h.tableOff > maxSize:
		return header{}, fmt.Errorf("table offset %d out of range", h.tableOff)
	}
	return h, nil
}

// blocks is the number of blocks a file of size bytes has.
func blocks(size uint64) uint64 { return (size + blockSize - 1) >> blockShift }

// Kinds of stored blocks.
const (
	kindHole = 0 // nothing stored: zeros (an all-zero entry)
	kindZstd = 1 // a zstd frame
	kindRaw  = 2 // the bytes themselves (they did not compress)
)

// entry names a block's stored extent.
type entry struct {
	off  uint64 // in the lower file
	n    uint32 // stored bytes
	kind uint8
	sum  uint64 // xxh64(block number (8, BE) || stored bytes)
}

// encode puts the 32 entry bytes into b: offset (8, BE), stored length
// (4), kind (1), zero (3), checksum (8), zero (4), CRC32C of bytes 0..28
// (4). A hole is 32 zero bytes.
func (e entry) encode(b []byte) {
	clear(b[:entrySize])
	if e.kind == kindHole {
		return
	}
	binary.BigEndian.PutUint64(b, e.off)
	binary.BigEndian.PutUint32(b[8:], e.n)
	b[12] = e.kind
	binary.BigEndian.PutUint64(b[16:], e.sum)
	binary.BigEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
}

func decodeEntry(b []byte) (entry, error) {
	if allZero(b[:entrySize]) {
		return entry{}, nil
	}
	if crc32.Checksum(b[:28], castagnoli) != binary.BigEndian.Uint32(b[28:]) {
		return entry{}, errors.New("entry checksum mismatch")
	}
	e := entry{off: binary.BigEndian.Uint64(b), n: binary.BigEndian.Uint32(b[8:]), kind: b[12], sum: binary.BigEndian.Uint64(b[16:])}
	if (e.kind != kindZstd && e.kind != kindRaw) || e.n == 0 || e.n > blockSize || e.off < headerSize || e.off > maxSize {
		return entry{}, fmt.Errorf("entry out of range (kind %d, %d bytes at %d)", e.kind, e.n, e.off)
	}
	return e, nil
}

// blockSum binds a block's stored bytes to its number, so that an extent
// named by another block's entry does not pass.
func blockSum(blk uint64, stored []byte) uint64 {
	var d xxhash.Digest
	d.Reset()
	var nb [8]byte
	binary.BigEndian.PutUint64(nb[:], blk)
	d.Write(nb[:])
	d.Write(stored)
	return d.Sum64()
}

func allZero(b []byte) bool {
	for len(b) > 0 {
		k := min(len(b), len(zeros))
		if string(b[:k]) != string(zeros[:k]) {
			return false
		}
		b = b[k:]
	}
	return true
}

var zeros [4096]byte
