package objstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// ReplayResult summarises a trace replay.
type ReplayResult struct {
	Requests, Hits int
	BytesRead      int64 // by hits
	BytesWritten   int64 // by misses
	Elapsed        time.Duration
}

// HitRatio is hits over requests.
func (r ReplayResult) HitRatio() float64 {
	if r.Requests == 0 {
		return 0
	}
	return float64(r.Hits) / float64(r.Requests)
}

// OpsPerSec is requests per second of wall time.
func (r ReplayResult) OpsPerSec() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

// ObjectStore is what a replay drives: this package's Store, or a baseline
// to compare it with.
type ObjectStore interface {
	Create(key string, data []byte) error
	Read(key string) ([]byte, error)
	Remove(key string) error
	Sync() error
}

// Replay plays a trace against st like a proxy cache: a request for a key
// not in the store is a miss and creates the object with size bytes of
// generated data; a hit reads it back and checks every byte. A hit whose
// size differs from the request is an updated object, replaced like a miss.
// progress, if not nil, is called after every request.
func Replay(st ObjectStore, t *TraceReader, progress func(ReplayResult)) (ReplayResult, error) {
	var res ReplayResult
	start := time.Now()
	for {
		req, err := t.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, err
		}
		// Check the size before generating the data: a corrupt or
		// hostile trace must not allocate more than the store could hold.
		if err := fits(st, req); err != nil {
			return res, fmt.Errorf("trace line %d: %w", t.Line(), err)
		}
		res.Requests++
		want := Generate(req.Key, req.Size)
		got, err := st.Read(req.Key)
		switch {
		case err == nil && bytes.Equal(got, want):
			res.Hits++
			res.BytesRead += int64(len(got))
		case err == nil && len(got) == len(want):
			return res, fmt.Errorf("trace line %d: key %s: read back %d bytes that differ from those written", t.Line(), req.Key, len(got))
		case err == nil || errors.Is(err, ErrNotFound):
			if err := st.Create(req.Key, want); err != nil {
				return res, fmt.Errorf("trace line %d: create %s (%d bytes): %w", t.Line(), req.Key, req.Size, err)
			}
			res.BytesWritten += int64(req.Size)
		default:
			return res, fmt.Errorf("trace line %d: read %s: %w", t.Line(), req.Key, err)
		}
		if progress != nil {
			progress(res)
		}
	}
	err := st.Sync()
	res.Elapsed = time.Since(start)
	return res, err
}

// maxReplaySize bounds a request's size for stores that cannot say what
// they hold: objects are below 4 GiB here (see docs/objstore.md, Limits).
const maxReplaySize = 1<<32 - 1

// fits checks that st could hold req before Replay allocates its data:
// for this package's Store, against its capacity and the largest object it
// takes; for another store, against maxReplaySize.
func fits(st ObjectStore, req Request) error {
	s, ok := st.(*Store)
	if !ok {
		if int64(req.Size) > maxReplaySize {
			return fmt.Errorf("size %d of %s is more than %d bytes: %w", req.Size, req.Key, int64(maxReplaySize), ErrTooLarge)
		}
		return nil
	}
	if len(req.Key) == 0 || len(req.Key) > maxKeyLen {
		return fmt.Errorf("key of %d bytes: %w", len(req.Key), ErrKeyLength)
	}
	// The data area's size never changes after Open: no lock is needed.
	capacity := int64(s.alloc.n) * blockSize
	if int64(req.Size) > capacity {
		return fmt.Errorf("size %d of %s is more than the store's capacity of %d bytes: %w", req.Size, req.Key, capacity, ErrTooLarge)
	}
	// Now diskSize cannot overflow; the rest is Create's own check.
	size := diskSize(len(req.Key), req.Size)
	if size > int64(^uint32(0)) || size > capacity {
		return fmt.Errorf("size %d of %s with its header and key is more than the store can hold (%d bytes): %w", req.Size, req.Key, min(capacity, int64(^uint32(0))), ErrTooLarge)
	}
	return nil
}

// Generate returns size bytes that depend only on key and size, so a reader
// can check an object without having kept it. It is a fast xorshift stream.
func Generate(key string, size int) []byte {
	b := make([]byte, size)
	x := keyHash(key) ^ uint64(size)*0x9e3779b97f4a7c15 | 1
	i := 0
	for ; i+8 <= size; i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for ; i < size; i++ {
		b[i] = byte(x >> (8 * (i & 7)))
	}
	return b
}
