package crypt

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// A name is stored as base64url without padding of
//
//	AES-SIV-CMAC-512(name key, AD = [directory ID], name)
//
// that is, the 16-byte synthetic IV followed by the ciphertext. SIV is
// deterministic, so the same name in the same directory always maps to the
// same lower name and lookups need no listing; the directory ID makes the
// mapping differ between directories, so equal names in two directories
// do not look equal below, and an entry moved to another directory behind
// the layer's back no longer decodes. The alphabet A-Z a-z 0-9 - _ never
// produces '/', NUL or a leading '.', so the layer's own files (named with
// a leading '.') can never collide with a name.
//
// From format version 2 on, a name is padded before it is sealed, as
// gocryptfs does, to a multiple of 16 bytes with PKCS#7 (1 to 16 bytes,
// each the count), so that lower names tell a name's length only to 16
// bytes.
//
// Names longer than 255 bytes once encoded (plaintext names over 175
// bytes, 159 when padded) are handed back in full; the wrap template
// stores them under a short hashed name.

var nameEncoding = base64.RawURLEncoding.Strict()

// maxNameLen is NAME_MAX: the longest name the layer accepts from above.
const maxNameLen = 255

var errNameAuth = errors.New("not a name of this crypt layer in this directory")

// EncodeName encrypts name for the directory whose ID is dir.
func (l *Layer) EncodeName(dir []byte, name string) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	plain := []byte(name)
	if l.version >= 2 {
		plain = padName(plain)
	}
	sealed := l.names.seal(make([]byte, 0, sivTagSize+len(plain)), [][]byte{dir}, plain)
	return nameEncoding.EncodeToString(sealed), nil
}

// DecodeName decrypts and authenticates a lower name of the directory
// whose ID is dir. Names that are not this layer's fail, and the template
// hides them.
func (l *Layer) DecodeName(dir []byte, lower string) (string, error) {
	sealed, ok := sealedName(lower)
	if !ok {
		return "", errNameAuth
	}
	plain, err := l.names.open(sealed[:0:0], [][]byte{dir}, sealed)
	if err != nil {
		return "", errNameAuth
	}
	if l.version >= 2 {
		if plain, err = unpadName(plain); err != nil {
			return "", errNameAuth
		}
	}
	name := string(plain)
	if checkName(name) != nil {
		// Authentic but not a name we would have encoded: a format error,
		// never shown.
		return "", errNameAuth
	}
	return name, nil
}

// sealedName gives the sealed bytes of lower name lower, if it has the
// shape of an encrypted name (whatever the directory ID): strict
// base64url, long enough for the synthetic IV and a byte.
func sealedName(lower string) ([]byte, bool) {
	if len(lower) < nameEncoding.EncodedLen(sivTagSize+1) || lower[0] == '.' {
		return nil, false
	}
	sealed, err := nameEncoding.DecodeString(lower)
	return sealed, err == nil
}

// checkName refuses what is not a single path component.
func checkName(name string) error {
	switch {
	case name == "" || name == "." || name == "..":
		return fmt.Errorf("name %q: %w", name, syscall.EINVAL)
	case strings.ContainsAny(name, "/\x00"):
		return fmt.Errorf("name %q contains '/' or NUL: %w", name, syscall.EINVAL)
	case len(name) > maxNameLen:
		return fmt.Errorf("name of %d bytes, at most %d: %w", len(name), maxNameLen, syscall.ENAMETOOLONG)
	}
	return nil
}

// namePad is the multiple padded names are sealed at.
const namePad = 16

// padName appends PKCS#7 padding to a multiple of namePad bytes.
func padName(name []byte) []byte {
	k := namePad - len(name)%namePad
	return append(name, bytes.Repeat([]byte{byte(k)}, k)...)
}

// unpadName strips padName's padding, which must be exact: a name sealed
// with other padding was not written by this layer.
func unpadName(p []byte) ([]byte, error) {
	if len(p) == 0 || len(p)%namePad != 0 {
		return nil, errNameAuth
	}
	k := int(p[len(p)-1])
	if k == 0 || k > namePad || !bytes.Equal(p[len(p)-k:], bytes.Repeat([]byte{byte(k)}, k)) {
		return nil, errNameAuth
	}
	return p[:len(p)-k], nil
}
