package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"errors"
)

// AES-SIV as specified in RFC 5297 (S2V over AES-CMAC, then AES-CTR).
// It is written here because no maintained Go implementation is available
// from the module proxy; it is short, built only on crypto/aes, and checked
// against the RFC's vectors in siv_test.go.
//
// SIV is deterministic: the same key, associated data and plaintext always
// give the same ciphertext, which is what a name codec needs (a lookup must
// find the name it encrypted before), and it stays secure when "nonces"
// repeat, leaking only equality of whole (AD, plaintext) pairs.

const sivTagSize = aes.BlockSize

var errSIVOpen = errors.New("aes-siv: message authentication failed")

// siv holds the two halves of an AES-SIV key: K1 for S2V (CMAC) and K2 for
// CTR. With a 64-byte key both are AES-256 (AEAD_AES_SIV_CMAC_512).
type siv struct {
	mac, ctr cipher.Block
	k1, k2   [aes.BlockSize]byte // CMAC subkeys of mac (RFC 4493)
}

func newSIV(key []byte) (*siv, error) {
	if len(key) != 32 && len(key) != 48 && len(key) != 64 {
		return nil, errors.New("aes-siv: key must be 32, 48 or 64 bytes")
	}
	half := len(key) / 2
	mac, err := aes.NewCipher(key[:half])
	if err != nil {
		return nil, err
	}
	ctr, err := aes.NewCipher(key[half:])
	if err != nil {
		return nil, err
	}
	s := &siv{mac: mac, ctr: ctr}
	var l [aes.BlockSize]byte
	mac.Encrypt(l[:], l[:])
	s.k1 = dbl(l)
	s.k2 = dbl(s.k1)
	return s, nil
}

// dbl multiplies by x in GF(2^128) with the polynomial x^128+x^7+x^2+x+1.
func dbl(b [aes.BlockSize]byte) [aes.BlockSize]byte {
	var out [aes.BlockSize]byte
	carry := b[0] >> 7
	for i := 0; i < aes.BlockSize-1; i++ {
		out[i] = b[i]<<1 | b[i+1]>>7
	}
	out[aes.BlockSize-1] = b[aes.BlockSize-1]<<1 ^ 0x87&-carry
	return out
}

// cmac is AES-CMAC (RFC 4493) of msg.
func (s *siv) cmac(msg []byte) [aes.BlockSize]byte {
	var x [aes.BlockSize]byte
	for len(msg) > aes.BlockSize {
		subtle.XORBytes(x[:], x[:], msg[:aes.BlockSize])
		s.mac.Encrypt(x[:], x[:])
		msg = msg[aes.BlockSize:]
	}
	// The last block: whole, it is masked with K1; short (or empty), it is
	// padded with 10* and masked with K2.
	var last [aes.BlockSize]byte
	copy(last[:], msg)
	if len(msg) == aes.BlockSize {
		subtle.XORBytes(last[:], last[:], s.k1[:])
	} else {
		last[len(msg)] = 0x80
		subtle.XORBytes(last[:], last[:], s.k2[:])
	}
	subtle.XORBytes(x[:], x[:], last[:])
	s.mac.Encrypt(x[:], x[:])
	return x
}

// s2v is RFC 5297's S2V over the associated data strings ad and the
// plaintext p: the synthetic IV.
func (s *siv) s2v(ad [][]byte, p []byte) [aes.BlockSize]byte {
	var zero [aes.BlockSize]byte
	d := s.cmac(zero[:])
	for _, a := range ad {
		c := s.cmac(a)
		d = dbl(d)
		subtle.XORBytes(d[:], d[:], c[:])
	}
	if len(p) >= aes.BlockSize {
		// T = p xorend D: D is folded into the last 16 bytes of p.
		t := make([]byte, len(p))
		copy(t, p)
		end := t[len(t)-aes.BlockSize:]
		subtle.XORBytes(end, end, d[:])
		return s.cmac(t)
	}
	d = dbl(d)
	var t [aes.BlockSize]byte
	copy(t[:], p)
	t[len(p)] = 0x80
	subtle.XORBytes(t[:], t[:], d[:])
	return s.cmac(t[:])
}

// xorCTR applies AES-CTR keyed with K2 from the counter derived from the
// synthetic IV v (its bits 31 and 63 cleared, so implementations with
// 32- or 64-bit counters agree).
func (s *siv) xorCTR(dst, src []byte, v [aes.BlockSize]byte) {
	v[8] &= 0x7f
	v[12] &= 0x7f
	cipher.NewCTR(s.ctr, v[:]).XORKeyStream(dst, src)
}

// seal appends V || C to dst.
func (s *siv) seal(dst []byte, ad [][]byte, plain []byte) []byte {
	v := s.s2v(ad, plain)
	dst = append(dst, v[:]...)
	start := len(dst)
	dst = append(dst, plain...)
	s.xorCTR(dst[start:], dst[start:], v)
	return dst
}

// open checks and decrypts V || C, appending the plaintext to dst.
func (s *siv) open(dst []byte, ad [][]byte, sealed []byte) ([]byte, error) {
	if len(sealed) < sivTagSize {
		return nil, errSIVOpen
	}
	var v [aes.BlockSize]byte
	copy(v[:], sealed)
	start := len(dst)
	dst = append(dst, sealed[sivTagSize:]...)
	s.xorCTR(dst[start:], dst[start:], v)
	if got := s.s2v(ad, dst[start:]); subtle.ConstantTimeCompare(got[:], v[:]) != 1 {
		clear(dst[start:])
		return nil, errSIVOpen
	}
	return dst, nil
}
