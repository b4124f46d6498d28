package net

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestEndToEndCrypt: crypt on the client over a plain export. shale init
// and shale passwd work on the 9p:// LOWER, and the server's directory
// holds only ciphertext: no name, no byte of content in the clear.
func TestEndToEndCrypt(t *testing.T) {
	lower := tempDir(t)
	sock := filepath.Join(tempDir(t), "s.sock")
	serve(t, sock, "--no-root-squash", lower)
	url := "9p://" + sock
	dir := tempDir(t)
	pass, pass2 := filepath.Join(dir, "pass"), filepath.Join(dir, "pass2")
	writeFile(t, pass, []byte("the first passphrase\n"), 0o600)
	writeFile(t, pass2, []byte("the second passphrase\n"), 0o600)

	run(t, shale, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", url)
	if _, err := os.Stat(filepath.Join(lower, "shale.conf")); err != nil {
		t.Fatalf("shale init over 9P wrote no shale.conf on the server: %v", err)
	}
	out, err := exec.Command(shale, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", url).CombinedOutput()
	oneLine(t, "a second init", out, err, "already")

	run(t, shale, "passwd", "--passfile", pass, "--new-passfile", pass2, url)
	mnt := tempDir(t)
	out, err = exec.Command(shale, "mount", "--layer", "crypt", "--passfile", pass, url, mnt).CombinedOutput()
	oneLine(t, "mount with the old passphrase", out, err, "passphrase")

	m := mount(t, url, "--layer", "crypt", "--passfile", pass2)
	secret := bytes.Repeat([]byte("a secret line of plain text\n"), 1000)
	os.Mkdir(filepath.Join(m, "private-dir"), 0o755)
	writeFile(t, filepath.Join(m, "private-dir", "plain-name.txt"), secret, 0o644)
	if err := os.Symlink("a-plain-target", filepath.Join(m, "link")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(m, "private-dir", "plain-name.txt")); err != nil || !bytes.Equal(b, secret) {
		t.Fatalf("read back through crypt over 9P: %v, equal %v", err, bytes.Equal(b, secret))
	}
	err = filepath.Walk(lower, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		for _, plain := range []string{"private-dir", "plain-name", "link"} {
			if strings.Contains(fi.Name(), plain) {
				t.Errorf("the server holds a plaintext name: %s", p)
			}
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			if bytes.Contains(b, []byte("a secret line")) {
				t.Errorf("the server holds plaintext in %s", p)
			}
		case fi.Mode()&os.ModeSymlink != 0:
			if target, _ := os.Readlink(p); strings.Contains(target, "plain-target") {
				t.Errorf("the server holds a plaintext symlink target in %s", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
