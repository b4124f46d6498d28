package crypt

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// RFC 4493 section 4: AES-CMAC with AES-128.
func TestCMACVectors(t *testing.T) {
	key := unhex(t, "2b7e151628aed2a6abf7158809cf4f3c")
	s, err := newSIV(append(key, key...)) // CMAC uses the first half
	if err != nil {
		t.Fatal(err)
	}
	msg := unhex(t, "6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e5130c81c46a35ce411e5fbc1191a0a52eff69f2445df4f9b17ad2b417be66c3710")
	for _, v := range []struct {
		n    int
		want string
	}{
		{0, "bb1d6929e95937287fa37d129b756746"},
		{16, "070a16b46b4d4144f79bdd9dd04a287c"},
		{40, "dfa66747de9ae63030ca32611497c827"},
		{64, "51f0bebf7e3b9d92fc49741779363cfe"},
	} {
		if got := s.cmac(msg[:v.n]); hex.EncodeToString(got[:]) != v.want {
			t.Errorf("CMAC of %d bytes = %x, want %s", v.n, got, v.want)
		}
	}
}

// RFC 5297 appendix A.
func TestSIVVectors(t *testing.T) {
	for _, v := range []struct {
		name, key string
		ad        []string
		plain     string
		want      string
	}{
		{
			name:  "A.1 deterministic",
			key:   "fffefdfcfbfaf9f8f7f6f5f4f3f2f1f0f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff",
			ad:    []string{"101112131415161718191a1b1c1d1e1f2021222324252627"},
			plain: "112233445566778899aabbccddee",
			want:  "85632d07c6e8f37f950acd320a2ecc9340c02b9690c4dc04daef7f6afe5c",
		},
		{
			name: "A.2 nonce-based",
			key:  "7f7e7d7c7b7a79787776757473727170404142434445464748494a4b4c4d4e4f",
			ad: []string{
				"00112233445566778899aabbccddeeffdeaddadadeaddadaffeeddccbbaa99887766554433221100",
				"102030405060708090a0",
				"09f911029d74e35bd84156c5635688c0",
			},
			plain: "7468697320697320736f6d6520706c61696e7465787420746f20656e6372797074207573696e67205349562d414553",
			want:  "7bdb6e3b432667eb06f4d14bff2fbd0fcb900f2fddbe404326601965c889bf17dba77ceb094fa663b7a3f748ba8af829ea64ad544a272e9c485b62a3fd5c0d",
		},
	} {
		t.Run(v.name, func(t *testing.T) {
			s, err := newSIV(unhex(t, v.key))
			if err != nil {
				t.Fatal(err)
			}
			var ad [][]byte
			for _, a := range v.ad {
				ad = append(ad, unhex(t, a))
			}
			sealed := s.seal(nil, ad, unhex(t, v.plain))
			if hex.EncodeToString(sealed) != v.want {
				t.Fatalf("seal = %x\nwant   %s", sealed, v.want)
			}
			plain, err := s.open(nil, ad, sealed)
			if err != nil || hex.EncodeToString(plain) != v.plain {
				t.Fatalf("open = %x, %v", plain, err)
			}
		})
	}
}

// Every length around the block boundaries round-trips, and any flipped
// bit or changed AD fails.
func TestSIVRoundTripAndTamper(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	key := make([]byte, 64)
	for i := range key {
		key[i] = byte(r.Uint32())
	}
	s, err := newSIV(key)
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n <= 70; n++ {
		plain := make([]byte, n)
		for i := range plain {
			plain[i] = byte(r.Uint32())
		}
		ad := [][]byte{{byte(n)}}
		sealed := s.seal(nil, ad, plain)
		got, err := s.open(nil, ad, sealed)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("n=%d: open = %x, %v", n, got, err)
		}
		if _, err := s.open(nil, [][]byte{{byte(n + 1)}}, sealed); err == nil {
			t.Fatalf("n=%d: opened under another AD", n)
		}
		for i := range sealed {
			bad := bytes.Clone(sealed)
			bad[i] ^= 1 << (i % 8)
			if got, err := s.open(nil, ad, bad); err == nil {
				t.Fatalf("n=%d: flipped byte %d opened to %x", n, i, got)
			}
		}
	}
	if _, err := s.open(nil, nil, make([]byte, 15)); err == nil {
		t.Fatal("opened a 15-byte input")
	}
}
