package shard

import (
	"fmt"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// The bucket layout is an on-disk format: changing any of these strands
// every managed directory made before.
const (
	bucketBits   = 10
	nBuckets     = 1 << bucketBits
	keyBits      = 52 // of the hash, ordering names within a bucket
	keyMask      = 1<<keyBits - 1
	bucketPrefix = ".shard-"
)

// Directory stream offsets of "." and ".."; entries in buckets have
// offsets of at least 1<<keyBits.
const (
	offDot    = 1
	offDotDot = 2
)

// place gives the bucket of name and the key that orders it in there.
func place(name string) (bucket int, key uint64) {
	h := xxhash.Sum64String(name)
	return int(h >> (64 - bucketBits)), h & keyMask
}

// offset is the stream offset of the entry after the one at bucket, key.
func offset(bucket int, key uint64) uint64 { return uint64(bucket+1)<<keyBits | key }

func bucketName(b int) string { return fmt.Sprintf("%s%03x", bucketPrefix, b) }

// bucketIndex tells whether name is a bucket's name, and which.
func bucketIndex(name string) (int, bool) {
	if len(name) != len(bucketPrefix)+3 || name[:len(bucketPrefix)] != bucketPrefix {
		return 0, false
	}
	d := name[len(bucketPrefix):]
	for _, c := range d {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return 0, false
		}
	}
	b, err := strconv.ParseUint(d, 16, 16)
	if err != nil || b >= nBuckets {
		return 0, false
	}
	return int(b), true
}
