package crypt

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
)

// A file header is a 2-byte big-endian format version and a 16-byte random
// file ID. The ID is bound into every block's associated data, so blocks
// cannot be moved between files, and a replaced header makes every block
// of the file fail to decode.
const (
	headerVersion = 1
	fileIDSize    = 16
	headerSize    = 2 + fileIDSize
)

// HeaderSize is the size of the header at the start of every non-empty
// lower file.
func (l *Layer) HeaderSize() int { return headerSize }

// NewHeader makes the header of a new file: the version and a fresh
// random file ID.
func (l *Layer) NewHeader() ([]byte, error) {
	h := make([]byte, headerSize)
	binary.BigEndian.PutUint16(h, headerVersion)
	rand.Read(h[2:]) // never fails (crypto/rand panics on a broken kernel)
	return h, nil
}

var errZeroID = errors.New("file header has an all-zero file ID (the start of the file was zeroed or is a hole)")

// CheckHeader vets a header read from a lower file. Its authenticity is
// checked by the blocks that follow, whose tags cover the file ID.
func (l *Layer) CheckHeader(hdr []byte) error {
	if len(hdr) != headerSize {
		return fmt.Errorf("file header is %d bytes, want %d (the file was cut short)", len(hdr), headerSize)
	}
	if v := binary.BigEndian.Uint16(hdr); v != headerVersion {
		return fmt.Errorf("file header has format version %d, this shale reads version %d", v, headerVersion)
	}
	var zero [fileIDSize]byte
	if string(hdr[2:]) == string(zero[:]) {
		return errZeroID
	}
	return nil
}
