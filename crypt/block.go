package crypt

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
)

// A block of up to blockSize plaintext bytes is stored as
//
//	nonce (16 random bytes) || AES-256-GCM ciphertext || tag (16 bytes)
//
// with associated data fileID (16 bytes) || block number (8 bytes,
// big-endian). The nonce is 128 bits, as in gocryptfs, rather than GCM's
// usual 96: nonces are random and a file system may write very many blocks
// under one key, and a longer random nonce pushes the chance of a repeat
// far beyond any volume a shale directory will see (docs/crypt-format.md).
const (
	blockSize      = 4096
	blockNonceSize = 16
	tagSize        = 16
	blockOverhead  = blockNonceSize + tagSize
	blockADSize    = fileIDSize + 8
)

// BlockSize is the plaintext size of a block.
func (l *Layer) BlockSize() int { return blockSize }

// Overhead is what encryption adds to every block: the nonce and the tag.
func (l *Layer) Overhead() int { return blockOverhead }

// EncodeBlock appends the stored form of plain, block blk of the file
// whose header is hdr, to dst, with a fresh random nonce.
func (l *Layer) EncodeBlock(dst, hdr []byte, blk uint64, plain []byte) ([]byte, error) {
	if len(plain) > blockSize {
		return nil, fmt.Errorf("block %d: %d bytes of plaintext, at most %d fit in a block", blk, len(plain), blockSize)
	}
	// The nonce goes straight into dst: no per-block allocation.
	dst = slices.Grow(dst, blockOverhead+len(plain))
	nonce := dst[len(dst) : len(dst)+blockNonceSize]
	rand.Read(nonce) // never fails (crypto/rand panics on a broken kernel)
	return l.sealBlock(dst, nonce, hdr, blk, plain)
}

// sealBlock is EncodeBlock with the nonce given, for known-answer tests.
func (l *Layer) sealBlock(dst, nonce, hdr []byte, blk uint64, plain []byte) ([]byte, error) {
	ad, err := blockAD(hdr, blk)
	if err != nil {
		return nil, err
	}
	dst = append(dst, nonce...)
	return l.content.Seal(dst, nonce, plain, ad[:]), nil
}

var errBlockAuth = errors.New("authentication failed: the data was altered, cut short, or moved from another block or file")

// DecodeBlock checks the stored form of block blk of the file whose header
// is hdr and appends its plaintext to dst. Any change to the stored bytes,
// the header, or the block's position makes it fail.
func (l *Layer) DecodeBlock(dst, hdr []byte, blk uint64, stored []byte) ([]byte, error) {
	if len(stored) < blockOverhead || len(stored) > blockOverhead+blockSize {
		return nil, fmt.Errorf("block %d: %d bytes stored, a block takes %d to %d (the file was cut short or extended)",
			blk, len(stored), blockOverhead, blockOverhead+blockSize)
	}
	ad, err := blockAD(hdr, blk)
	if err != nil {
		return nil, err
	}
	out, err := l.content.Open(dst, stored[:blockNonceSize], stored[blockNonceSize:], ad[:])
	if err != nil {
		return nil, fmt.Errorf("block %d: %w", blk, errBlockAuth)
	}
	return out, nil
}

// blockAD is the associated data of block blk: the file ID from the
// header, then the block number.
func blockAD(hdr []byte, blk uint64) (ad [blockADSize]byte, err error) {
	if len(hdr) != headerSize {
		return ad, fmt.Errorf("block %d: file header is %d bytes, want %d", blk, len(hdr), headerSize)
	}
	copy(ad[:], hdr[2:])
	binary.BigEndian.PutUint64(ad[fileIDSize:], blk)
	return ad, nil
}
