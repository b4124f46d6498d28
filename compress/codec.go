package compress

import (
	"errors"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Level is zstd's fastest level: on Go's source tree it stores 2.5% more
// than the default level (about zstd -3) and compresses 40% faster
// (docs/compress.md has the measurement).
const level = zstd.SpeedFastest

var codecs = sync.OnceValues(func() (*zstd.Encoder, *zstd.Decoder) {
	// EncodeAll and DecodeAll may run concurrently, up to the
	// concurrency given: one per CPU. Our own checksums guard the blocks,
	// so zstd's are off; the decoder refuses frames that claim more than
	// a block, so a hostile one cannot make it allocate much.
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(level), zstd.WithEncoderCRC(false),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)), zstd.WithZeroFrames(true), zstd.WithLowerEncoderMem(true))
	if err != nil {
		panic("compress: zstd encoder: " + err.Error()) // fixed options: a programming error
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderMaxMemory(blockSize),
		zstd.IgnoreChecksum(true))
	if err != nil {
		panic("compress: zstd decoder: " + err.Error())
	}
	return enc, dec
})

// encodeBlock gives the stored form of block blk's content p (at most a
// block): a hole if p is all zeros, a zstd frame, or p itself if that is
// no shorter.
func encodeBlock(blk uint64, p []byte) (entry, []byte) {
	if allZero(p) {
		return entry{}, nil
	}
	enc, _ := codecs()
	s := enc.EncodeAll(p, make([]byte, 0, len(p)))
	kind := uint8(kindZstd)
	if len(s) >= len(p) {
		s, kind = p, kindRaw
	}
	return entry{n: uint32(len(s)), kind: kind, sum: blockSum(blk, s)}, s
}

var errChecksum = errors.New("block checksum mismatch")

// decodeBlock checks stored, the extent of block blk that e names, and
// returns its content.
func decodeBlock(blk uint64, e entry, stored []byte) ([]byte, error) {
	if uint64(len(stored)) != uint64(e.n) || blockSum(blk, stored) != e.sum {
		return nil, errChecksum
	}
	if e.kind == kindRaw {
		return stored, nil
	}
	_, dec := codecs()
	p, err := dec.DecodeAll(stored, make([]byte, 0, blockSize))
	if err != nil {
		return nil, err
	}
	if len(p) > blockSize {
		return nil, errors.New("block decodes to more than 64 KiB")
	}
	return p, nil
}
