package crypt

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Known-answer vectors: fixed keys, IDs and nonces in, the stored bytes
// out. The same values are printed in docs/crypt-format.md (checked
// below), and recomputed by an independent implementation,
// testdata/crosscheck.py, with Python's cryptography package.
var katWant = map[string]string{
	"content_key":       "aaca6d18482015161279ac1ca27a9dde3e0fc37e8b9d0af605fba3d38b102552",
	"name_key":          "1fb00fd23da34a47cf33d9f0fc8dea755025cdde477f6ae524b3fac68e3ab81fef0a4031a3a616b32846bc05de03ea15c8f8b2a97141eb004b75e9ed245376f4",
	"link_key":          "ffb041933323727ac5fd3c6baa10ee3e94690ed16bf846df61008471ce69116a",
	"block":             "a0a1a2a3a4a5a6a7a8a9aaabacadaeaf97059ccb1f1f47d485422fbf712c22c5aa02c1f2399ad9f7218045fd74648b8303bd98a54c81e88bf7d5b0e446fbbc",
	"full_block_sha256": "35acae9d52570e84b55cec932813453b8d17b291e2702a097259743d9359241c",
	"name":              "wqV_KogzlQJbZaLIB9Fs5RvoH4i_36762wFv__epWcmztQAe",
	"link":              "wMHCw8TFxsfIycrLVmpf1Seyze6uOFPayNpCtkvwME1lQNGnAx4wyV6vzw",
	"long_link":         ".shale.T.XrcVk852mGOiI-_5k36ZC3o-R6nWkkpeuXi81dZqFdo",
	"config_ad":         "7368616c652d637279707420763120736372797074000a0000000800000001404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f",
	"wrapped_key":       "dd658cb90aa3af22d6ed7505a393d609b12ef9b4f449d898ac49064be3b51768e784c41dfdd1b59242a922e6128528ec",
	"checksum":          "bfe1a569a93b1d15df8b4fcb94949529e8f1f7d0e4a3450acd9c9c7f39ff68c3",
	"name_v2":           "HXDekAelers5c3K1Apr90OkKYJ7KDs3m852w-euWZrQ_fNgASHRnPcKDlfumGHZz",
	"config_ad_v2":      "7368616c652d637279707420763220736372797074000a0000000800000001404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f01",
	"wrapped_key_v2":    "dd658cb90aa3af22d6ed7505a393d609b12ef9b4f449d898ac49064be3b517682fad534eb8dbf6d096892751ee988453",
	"checksum_v2":       "75622bd74788276d3305a1b2ba8aeb4370f8cfbd8ba60e4f1e3fa0a9f51abb7b",
}

// seq is start, start+1, … (n bytes): the fixed inputs of the vectors.
func seq(start, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(start + i)
	}
	return b
}

// katGot computes the vectors with this package's code.
func katGot(t *testing.T) map[string]string {
	master := seq(0, masterKeySize)
	l, err := newLayer(master, 1)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, k := range []struct {
		name, info string
		n          int
	}{{"content_key", infoContent, 32}, {"name_key", infoNames, 64}, {"link_key", infoLinks, 32}} {
		key, _ := hkdf.Key(sha256.New, master, nil, k.info, k.n)
		got[k.name] = hex.EncodeToString(key)
	}
	hdr := append([]byte{0, 1}, seq(0x10, fileIDSize)...)
	if err := l.CheckHeader(hdr); err != nil {
		t.Fatal(err)
	}
	plain := []byte("shale crypt known-answer block.")
	stored, _ := l.sealBlock(nil, seq(0xa0, blockNonceSize), hdr, 5, plain)
	got["block"] = hex.EncodeToString(stored)
	if back, err := l.DecodeBlock(nil, hdr, 5, stored); err != nil || string(back) != string(plain) {
		t.Errorf("the block vector does not decode: %v", err)
	}
	full := make([]byte, blockSize)
	for i := range full {
		full[i] = byte(i % 251)
	}
	stored, _ = l.sealBlock(nil, seq(0xb0, blockNonceSize), hdr, 0, full)
	sum := sha256.Sum256(stored)
	got["full_block_sha256"] = hex.EncodeToString(sum[:])
	got["name"], _ = l.EncodeName(seq(0x20, dirIDSize), "Hello, shale ☃.txt")
	got["link"] = string(l.sealLink(seq(0xc0, linkNonceSize), []byte("../ünï/target")))
	got["long_link"], _ = standIn(l.sealLink(seq(0xc0, linkNonceSize), []byte(strings.Repeat("t/", 1550))))
	l2, err := newLayer(master, 2)
	if err != nil {
		t.Fatal(err)
	}
	got["name_v2"], _ = l2.EncodeName(seq(0x20, dirIDSize), "Hello, shale ☃.txt")
	for _, v := range []struct {
		suffix string
		c      config
	}{{"", config{Version: 1}}, {"_v2", config{Version: 2, FillHoles: true}}} {
		c := v.c
		c.Format = configFormat
		c.KDF = kdfParams{Name: kdfScrypt, LogN: 10, R: 8, P: 1, Salt: seq(0x40, saltSize)}
		c.Nonce = seq(0x60, wrapNonceSize)
		if err := c.wrap(master, []byte("correct horse battery staple")); err != nil {
			t.Fatal(err)
		}
		got["config_ad"+v.suffix] = hex.EncodeToString(c.wrapAD())
		got["wrapped_key"+v.suffix] = hex.EncodeToString(c.WrappedKey)
		got["checksum"+v.suffix] = c.Checksum
		if err := c.validate(); err != nil {
			t.Errorf("the config%s vector does not validate: %v", v.suffix, err)
		}
		if m, err := c.unwrap([]byte("correct horse battery staple"), "vector"); err != nil || hex.EncodeToString(m) != hex.EncodeToString(master) {
			t.Errorf("the config%s vector does not unwrap: %v", v.suffix, err)
		}
	}
	return got
}

func TestKnownAnswers(t *testing.T) {
	got := katGot(t)
	doc, err := os.ReadFile("../docs/crypt-format.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range katWant {
		if got[name] != want {
			t.Errorf("%s = %s\nwant %s", name, got[name], want)
		}
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/crypt-format.md does not show %s %s", name, want)
		}
	}
}

// TestCrossCheck has an independent implementation read the format.
func TestCrossCheck(t *testing.T) {
	if exec.Command("python3", "-c", "import cryptography.hazmat.primitives.ciphers.aead").Run() != nil {
		t.Skip("python3 with the cryptography package is not installed")
	}
	out, err := exec.Command("python3", "testdata/crosscheck.py").CombinedOutput()
	if err != nil {
		t.Fatalf("crosscheck.py: %v\n%s", err, out)
	}
	seen := 0
	for line := range strings.Lines(string(out)) {
		name, value, _ := strings.Cut(strings.TrimSpace(line), " ")
		if want, ok := katWant[name]; !ok || value != want {
			t.Errorf("crosscheck.py: %s = %s, want %s", name, value, want)
		}
		seen++
	}
	if seen != len(katWant) {
		t.Errorf("crosscheck.py gave %d values, want %d", seen, len(katWant))
	}
}
