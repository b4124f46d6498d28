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
func newRequest(key string, data []byte, size int64) *request {
	hd := header{keyLen: uint16(len(key)), dataLen: uint32(len(data)), hash: keyHash(key)}
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
func (s *Store) readObject(key string, e entry) ([]byte, error) {
	off := int64(superBlocks+e.block) * blockSize
	var buf, data []byte
	if aligned(e.size) {
		buf = alignedBuf(int(blocksFor(int64(e.size))) * blockSize)
		data = buf[pageSize:e.size]
	} else {
		if int(e.size) < headerSize+len(key) {
			return nil, errMismatch // another key with the same hash
		}
		buf = make([]byte, e.size)
		data = buf[headerSize+len(key):]
	}
	if err := s.dev.readAt(buf, off); err != nil {
		return nil, err
	}
	hd, ok := decodeHeader(buf)
	switch {
	case !ok,
		int(hd.keyLen) != len(key),
		string(buf[headerSize:headerSize+len(key)]) != key,
		int(hd.dataLen) != len(data),
		(hd.flags == flagAligned) != aligned(e.size),
		crc32.Update(objectCRC(buf, key, nil), castagnoli, data) != hd.crc:
		return nil, errMismatch
	}
	return data, nil
}
