package compress

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The known-answer vectors of docs/compress.md: shale's code produces
// exactly these bytes, the page shows them, and zstd(1) decodes the
// stored frame (the format is plain zstd).
var kats = map[string]string{
	"header": "8953485a0d0a1a0a000110000000000000000000000186a0000000000000004000000002000000000000000000000000000000000000000000000000228686d5",
	"entry":  "00000000000000800000000d02000000f5e9d779fd8929640000000013a9a07d",
	"small":  "8953485a0d0a1a0a0001100000000000000000000000000d000000000000004000000001000000000000000000000000000000000000000000000000f059c5c300000000000000600000000d02000000f0643c5eac91140a00000000729ffab568656c6c6f2c207368616c650a",
	"frame":  "28b52ffd607016750000307368616c652001540603306797",
}

func TestKnownAnswers(t *testing.T) {
	got := map[string]string{"header": hex.EncodeToString(header{size: 100000, tableOff: 64, tableCap: 2}.encode())}
	b := make([]byte, entrySize)
	entry{off: 128, n: 13, kind: kindRaw, sum: blockSum(1, []byte("hello, shale\n"))}.encode(b)
	got["entry"] = hex.EncodeToString(b)
	dir := t.TempDir()
	root := open(t, dir)
	for name, data := range map[string][]byte{"small": []byte("hello, shale\n"), "shale": bytes.Repeat([]byte("shale "), 1000)} {
		n, h := openFile(t, root, name)
		h.Write(ctx, data, 0)
		h.Release(ctx)
		n.Forget()
	}
	s, _ := os.ReadFile(filepath.Join(dir, "small"))
	got["small"] = hex.EncodeToString(s)
	a, _ := os.ReadFile(filepath.Join(dir, "shale"))
	if len(a) <= 96 {
		t.Fatalf("the lower file of 6000 bytes of text is %d bytes", len(a))
	}
	got["frame"] = hex.EncodeToString(a[96:])
	doc, err := os.ReadFile("../docs/compress.md")
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range kats {
		if got[k] != want {
			t.Errorf("%s: got\n%s\nwant\n%s", k, got[k], want)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(doc)), ""), want) {
			t.Errorf("docs/compress.md does not show the %s vector", k)
		}
	}
	// zstd(1) is the independent check of the frame.
	frame, _ := hex.DecodeString(kats["frame"])
	cmd := exec.Command("zstd", "-d", "-c")
	cmd.Stdin = bytes.NewReader(frame)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zstd -d of the stored frame (scripts/setup.sh installs zstd): %v", err)
	}
	if !bytes.Equal(out, bytes.Repeat([]byte("shale "), 1000)) {
		t.Errorf("zstd -d gives %q…, want \"shale \" 1000 times", out[:min(len(out), 20)])
	}
	if sum := sha256.Sum256(a); hex.EncodeToString(sum[:]) != "7506ebedbc9a2062c1da343806779237014c33c9061b97e30bffdac1dbb2a410" {
		t.Errorf("the lower file of \"shale \" x 1000 has SHA-256 %x", sum)
	}
}
