// Package objstore is a store for immutable objects that always have a copy
// elsewhere: the disk cache of a web proxy, or of shale's network client. It
// follows the cache file system (CFS) of seeds/003 and fills in what that
// paper left open (compaction, replacement, raw I/O with buffering).
//
// # Design
//
// The store is one preallocated file or block device cut into 512-byte
// blocks. Each object is written contiguously: a 24-byte header, the key,
// the data. The whole index is in memory: an open-addressed table of
// 32-bit slots (an object id plus a hint, the high bits of the key's 64-bit
// hash, compared before anything else) over 16-byte entries (hash, first
// block, size on disk). The replacement policy keeps 8 bytes of links and a
// bit per object. That is under 32 bytes an object in all; keys live only on
// disk, in the header, and every read checks the key and a CRC-32C over
// header, key and data, so a hash collision, a stale block or a torn write
// is a miss and never another object's bytes.
//
// Create indexes the object, allocates its blocks and queues its write; one
// disk goroutine performs writes in order, merging adjacent ones into one
// pwritev. Sync waits for a session's writes. Remove and Length touch only
// memory. Read runs in the caller. Small objects go through the page cache;
// objects of 256 KiB and more are laid out block aligned and written and
// read with O_DIRECT at the device's sequential bandwidth.
//
// Free space is a bitmap with next-fit allocation. When free space runs
// short the policy (SIEVE by default, LRU for comparison) picks victims
// until 1/64 of the store is free; when there is enough free space but no
// run long enough, compaction slides objects down to gather a run.
//
// A clean Close saves the index into free space with a checksum and marks
// the superblock clean; Open verifies and loads it, then marks the store
// dirty, so after a crash the index is dropped and every object is a miss.
//
// # On-disk format
//
// All integers little endian.
//
//	block 0-7   superblock (4 KiB):
//	            0  magic "SHALECFS"   8  version (1)      12 block size (512)
//	            16 data blocks        24 state (0 dirty, 1 clean)
//	            32 index block        40 index bytes      48 index CRC-32C
//	            56 hits               64 misses           76 CRC-32C of bytes 0-75
//	block 8-    data area; index block numbers count from here
//
//	object      0  magic 0x6f534643 ("CFSo")   4 key length   6 flags (1 = aligned)
//	            8  data length   12 CRC-32C of header (this field 0), key, data
//	            16 xxHash64 of the key
//	            24 key, then data (packed); or, aligned, the data at the next block
//
//	saved index 16 bytes an object, oldest first: hash, first block, size on disk
package objstore
