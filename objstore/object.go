package objstore

import (
	"errors"
	"hash/crc32"
)

// errMismatch means the bytes on disk are not the object the index expects:
// a crash, a torn write or a reused block. The caller treats it as a miss.
var errMismatch = errors.New("object on disk does not match the index")

// zeros pads packed objects to a whole block, so that writes of adjacent
// objects stay contiguous and the queue can merge them.
var zeros [blockSize]byte

// newRequest lays an object out for writing. It runs before the store lock
// is taken, so checksumming large objects does not hold up other callers.
func newRequest(key string, h uint64, data []byte, size int64) *request {
	hd := header{keyLen: uint16(len(key)), dataLen: uint32(len(data)), hash: h}
	r := &request{key: key, data: data, n: int(blocksFor(size)) * blockSize}
	var head []byte
	if aligned(uint32(size)) {
		// Aligned layout: header and key fill the first page, the data
		// follows page aligned, and all buffers suit O_DIRECT.
		hd.flags = flagAligned
		head = alignedBuf(pageSize)
		r.direct = true
	} else {
		head = make([]byte, headerSize+len(key))
	}
	hd.encode(head)
	copy(head[headerSize:], key)
	hd.crc = objectCRC(head, key, data)
	hd.encode(head)
	r.bufs = append(r.bufs, head)
	if r.direct {
		body := data[:len(data)&^(blockSize-1)]
		r.bufs = append(r.bufs, body)
		if tail := data[len(body):]; len(tail) > 0 {
			t := alignedBuf(blockSize)
			copy(t, tail)
			r.bufs = append(r.bufs, t)
		}
		return r
	}
	r.bufs = append(r.bufs, data)
	if pad := r.n - int(size); pad > 0 {
		r.bufs = append(r.bufs, zeros[:pad])
	}
	return r
}

// readObject reads e from disk and checks that it is key's object, whole.
// The data lands in p when p has room (and, for a large object, is block
// aligned, as Go's large allocations are); otherwise in a new buffer.
func (s *Store) readObject(key string, e entry, p []byte) ([]byte, error) {
	off := int64(superBlocks+e.block) * blockSize
	n := dataLen(e.size, len(key))
	if n < 0 {
		return nil, errMismatch // another key with the same hash
	}
	var head, data []byte
	wait := func(int) error { return nil }
	if aligned(e.size) {
		// Header and data are separate reads, so that the data can go
		// straight into the caller's buffer by direct I/O.
		head = make([]byte, headerSize+len(key))
		if err := s.dev.readAt(head, off); err != nil {
			return nil, err
		}
		need := int(alignUp(uint32(n), blockSize))
		buf := p
		if cap(p) < need || !isAligned(p[:need]) {
			buf = alignedBuf(need)
		}
		wait = s.dev.readAhead(buf[:need], off+pageSize)
		data = buf[:n]
	} else {
		buf := make([]byte, e.size)
		if err := s.dev.readAt(buf, off); err != nil {
			return nil, err
		}
		head, data = buf[:headerSize+len(key)], buf[headerSize+len(key):]
	}
	hd, ok := decodeHeader(head)
	if !ok || int(hd.keyLen) != len(key) || string(head[headerSize:]) != key ||
		int(hd.dataLen) != n || (hd.flags == flagAligned) != aligned(e.size) {
		return nil, errMismatch
	}
	// Checksum each chunk as it arrives, while the next is being read.
	c := objectCRC(head, key, nil)
	for done := 0; done < n; {
		next := min(done+readChunk, n)
		if err := wait(next); err != nil {
			return nil, err
		}
		c = crc32.Update(c, castagnoli, data[done:next])
		done = next
	}
	if c != hd.crc {
		return nil, errMismatch
	}
	return data, nil
}
