package crypt

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shalefs/shale/hostfs"
	"github.com/shalefs/shale/layer"
	"github.com/shalefs/shale/stack"
)

// testLogN keeps scrypt to about a millisecond in tests.
const testLogN = 10

// lowerOf is the root of the host directory dir, as the commands open a
// LOWER, until the test ends.
func lowerOf(t *testing.T, dir string) layer.Node {
	t.Helper()
	root, err := hostfs.New(stack.New(stack.Options{}), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(root.Forget)
	return root
}

func initDir(t *testing.T, pass string) string {
	t.Helper()
	dir := t.TempDir()
	if err := Init(ctx, lowerOf(t, dir), dir, []byte(pass), Options{ScryptLogN: testLogN}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// sameKeys tells whether two layers have the same master key, by whether
// one decodes what the other encodes.
func sameKeys(a, b *Layer) bool {
	hdr, _ := a.NewHeader()
	stored, _ := a.EncodeBlock(nil, hdr, 0, []byte("x"))
	_, err := b.DecodeBlock(nil, hdr, 0, stored)
	return err == nil
}

func TestInitOpenChange(t *testing.T) {
	dir := initDir(t, "correct horse")
	l1, err := Open(ctx, lowerOf(t, dir), dir, []byte("correct horse"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, lowerOf(t, dir), dir, []byte("wrong horse"))
	if !errors.Is(err, ErrWrongPassphrase) || err.Error() != "wrong passphrase for "+filepath.Join(dir, ConfigName) {
		t.Errorf("wrong passphrase: %v", err)
	}
	if err := ChangePassphrase(ctx, lowerOf(t, dir), dir, []byte("wrong horse"), []byte("new")); !errors.Is(err, ErrWrongPassphrase) {
		t.Errorf("ChangePassphrase with a wrong one: %v", err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, ConfigName))
	if err := ChangePassphrase(ctx, lowerOf(t, dir), dir, []byte("correct horse"), []byte("battery staple")); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(filepath.Join(dir, ConfigName))
	if bytes.Equal(before, after) {
		t.Fatal("the config did not change")
	}
	if _, err := Open(ctx, lowerOf(t, dir), dir, []byte("correct horse")); !errors.Is(err, ErrWrongPassphrase) {
		t.Errorf("the old passphrase still opens: %v", err)
	}
	l2, err := Open(ctx, lowerOf(t, dir), dir, []byte("battery staple"))
	if err != nil {
		t.Fatal(err)
	}
	if !sameKeys(l1, l2) {
		t.Error("the master key changed with the passphrase")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 || entries[0].Name() != dirIDName || entries[1].Name() != ConfigName {
		t.Errorf("LOWER holds %v after a passphrase change, want only %s and %s", entries, dirIDName, ConfigName)
	}
	if st, _ := os.Stat(filepath.Join(dir, ConfigName)); st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", ConfigName, st.Mode())
	}
	// Two directories never share a master key.
	other := initDir(t, "correct horse")
	l3, _ := Open(ctx, lowerOf(t, other), other, []byte("correct horse"))
	if sameKeys(l1, l3) {
		t.Error("two inits gave one master key")
	}
}

func TestInitRefusals(t *testing.T) {
	dir := initDir(t, "p")
	if err := Init(ctx, lowerOf(t, dir), dir, []byte("p"), Options{ScryptLogN: testLogN}); !errors.Is(err, ErrInitialised) {
		t.Errorf("second init: %v", err)
	}
	full := t.TempDir()
	os.WriteFile(filepath.Join(full, "f"), nil, 0o644)
	if err := Init(ctx, lowerOf(t, full), full, []byte("p"), Options{ScryptLogN: testLogN}); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("init of a non-empty directory: %v", err)
	}
	if err := Init(ctx, lowerOf(t, full), full, []byte("p"), Options{ScryptLogN: testLogN, Force: true}); err != nil {
		t.Errorf("forced init of a non-empty directory: %v", err)
	}
	empty := t.TempDir()
	if err := Init(ctx, lowerOf(t, empty), empty, nil, Options{ScryptLogN: testLogN}); err == nil {
		t.Error("init with an empty passphrase")
	}
	if err := Init(ctx, lowerOf(t, empty), empty, []byte("p"), Options{ScryptLogN: 40}); err == nil {
		t.Error("init with scrypt log N 40")
	}
	// A missing directory is created by shale init, before any backend can
	// open it: TestCLIInit.
	if _, err := Open(ctx, lowerOf(t, empty), empty, []byte("p")); !errors.Is(err, ErrNoConfig) {
		t.Errorf("open of a plain directory: %v", err)
	}
}

// Any change to the config fails to open, as damage when the file no
// longer hangs together and as a wrong passphrase when it was rewritten
// consistently (which needs no secret, so only the AD can catch it).
func TestConfigTamper(t *testing.T) {
	dir := initDir(t, "p")
	path := filepath.Join(dir, ConfigName)
	orig, _ := os.ReadFile(path)
	mutate := func(name string, f func(c *config), want error) {
		t.Helper()
		var c config
		if err := json.Unmarshal(orig, &c); err != nil {
			t.Fatal(err)
		}
		f(&c)
		data, _ := json.Marshal(&c)
		os.WriteFile(path, data, 0o600)
		if _, err := Open(ctx, lowerOf(t, dir), dir, []byte("p")); !errors.Is(err, want) {
			t.Errorf("%s: Open = %v, want %v", name, err, want)
		}
	}
	resum := func(c *config) { c.Checksum = c.checksum() }
	mutate("flipped wrapped key", func(c *config) { c.WrappedKey[3] ^= 1 }, ErrDamaged)
	mutate("flipped wrapped key, checksum fixed", func(c *config) { c.WrappedKey[3] ^= 1; resum(c) }, ErrWrongPassphrase)
	mutate("salt changed, checksum fixed", func(c *config) { c.KDF.Salt[0] ^= 1; resum(c) }, ErrWrongPassphrase)
	mutate("nonce changed, checksum fixed", func(c *config) { c.Nonce[0] ^= 1; resum(c) }, ErrWrongPassphrase)
	mutate("log N lowered, checksum fixed", func(c *config) { c.KDF.LogN--; resum(c) }, ErrWrongPassphrase)
	mutate("r changed, checksum fixed", func(c *config) { c.KDF.R = 4; resum(c) }, ErrWrongPassphrase)
	mutate("p changed, checksum fixed", func(c *config) { c.KDF.P = 2; resum(c) }, ErrWrongPassphrase)
	mutate("version", func(c *config) { c.Version = 3 }, ErrDamaged)
	mutate("version 1, checksum fixed", func(c *config) { c.Version = 1; resum(c) }, ErrWrongPassphrase)
	mutate("fill_holes on, checksum fixed", func(c *config) { c.FillHoles = true; resum(c) }, ErrWrongPassphrase)
	mutate("fill_holes in version 1", func(c *config) { c.Version = 1; c.FillHoles = true; resum(c) }, ErrDamaged)
	mutate("format", func(c *config) { c.Format = "gocryptfs" }, ErrDamaged)
	mutate("kdf", func(c *config) { c.KDF.Name = "argon2id" }, ErrDamaged)
	mutate("huge scrypt cost", func(c *config) { c.KDF.LogN = 30; resum(c) }, ErrDamaged)
	mutate("huge r", func(c *config) { c.KDF.R = 1 << 30; resum(c) }, ErrDamaged)
	mutate("short salt", func(c *config) { c.KDF.Salt = c.KDF.Salt[:8]; resum(c) }, ErrDamaged)
	mutate("short wrapped key", func(c *config) { c.WrappedKey = c.WrappedKey[:40]; resum(c) }, ErrDamaged)
	for _, data := range []string{"", "{", "null", "[]", `{"format":"shale-crypt"}`, strings.Replace(string(orig), "{", `{"extra":1,`, 1), string(orig[:len(orig)/2])} {
		os.WriteFile(path, []byte(data), 0o600)
		if _, err := Open(ctx, lowerOf(t, dir), dir, []byte("p")); !errors.Is(err, ErrDamaged) {
			t.Errorf("config %.40q: Open = %v, want damaged", data, err)
		}
	}
	os.WriteFile(path, orig, 0o600)
	if _, err := Open(ctx, lowerOf(t, dir), dir, []byte("p")); err != nil {
		t.Errorf("restored config: %v", err)
	}
}
