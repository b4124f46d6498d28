package crypt

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
)

// A symlink target is stored as base64url without padding of
//
//	nonce (12 random bytes) || AES-256-GCM(link key, target, no AD) || tag
//
// A random nonce (rather than SIV) hides whether two links point to the
// same place, and makes every stored form unique, which wrap needs of
// those too long for a lower symlink (over 4095 bytes: targets over 3043
// bytes): it keeps them in sidecar files named by their hash.
const (
	linkNonceSize = 12
	linkOverhead  = linkNonceSize + tagSize
)

var linkEncoding = base64.RawURLEncoding.Strict()

var errLinkAuth = errors.New("symlink target fails authentication: it was altered or is not this crypt layer's")

// EncodeLink encrypts a symlink target.
func (l *Layer) EncodeLink(target []byte) ([]byte, error) {
	var nonce [linkNonceSize]byte
	rand.Read(nonce[:]) // never fails (crypto/rand panics on a broken kernel)
	return l.sealLink(nonce[:], target), nil
}

// sealLink is EncodeLink with the nonce given, for known-answer tests.
func (l *Layer) sealLink(nonce, target []byte) []byte {
	sealed := l.links.Seal(append([]byte(nil), nonce...), nonce, target, nil)
	return linkEncoding.AppendEncode(nil, sealed)
}

// DecodeLink authenticates and decrypts a stored symlink target.
func (l *Layer) DecodeLink(stored []byte) ([]byte, error) {
	sealed, err := linkEncoding.AppendDecode(nil, stored)
	if err != nil || len(sealed) < linkOverhead {
		return nil, errLinkAuth
	}
	target, err := l.links.Open(nil, sealed[:linkNonceSize], sealed[linkNonceSize:], nil)
	if err != nil {
		return nil, errLinkAuth
	}
	return target, nil
}

// LinkSize is the length of the target stored in stored bytes, for stat.
func (l *Layer) LinkSize(stored uint64) uint64 {
	raw := uint64(linkEncoding.DecodedLen(int(stored)))
	if raw < linkOverhead {
		return 0
	}
	return raw - linkOverhead
}
