package net

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestExportAndViewCoherent: shale serve --stack with a FUSE view and a 9P
// export of one layer, in one process. What a 9P client writes, the view
// shows at once, though the kernel caches it for an hour: the export is a
// holder of the stack's coherence manager.
func TestExportAndViewCoherent(t *testing.T) {
	for _, layerName := range []string{"", "rot13"} {
		lower := tempDir(t)
		view := tempDir(t)
		sock := filepath.Join(tempDir(t), "s.sock")
		spec := fmt.Sprintf("lower = %q\n", lower)
		n := 0
		if layerName != "" {
			spec += fmt.Sprintf("[[layer]]\nname = %q\n", layerName)
			n = 1
		}
		spec += fmt.Sprintf("[[view]]\nlayer = %d\nmountpoint = %q\n[[export]]\nlayer = %d\nname = \"v\"\n", n, view, n)
		file := filepath.Join(tempDir(t), "stack.toml")
		writeFile(t, file, []byte(spec), 0o644)
		s := serve(t, sock, "--no-root-squash", "--stack", file)
		t.Cleanup(func() { s.stop(); umount(view) })
		m := mount(t, "9p://"+sock+"?aname=v")

		p := filepath.Join(view, "f")
		writeFile(t, p, []byte("one"), 0o644)
		if b, _ := os.ReadFile(p); string(b) != "one" {
			t.Fatalf("%s: view reads %q", layerName, b)
		}
		writeFile(t, filepath.Join(m, "f"), []byte("two, longer"), 0o644)
		if b, _ := os.ReadFile(p); string(b) != "two, longer" {
			t.Errorf("layer %q: after a write over 9P the view reads %q", layerName, b)
		}
		if err := os.Rename(filepath.Join(m, "f"), filepath.Join(m, "g")); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("layer %q: after a rename over 9P the view still has f: %v", layerName, err)
		}
		// The other way: the 9P mount caches for its --timeout (1s) only.
		writeFile(t, filepath.Join(view, "h"), []byte("from the view"), 0o644)
		deadline := time.Now().Add(20 * time.Second)
		for {
			b, _ := os.ReadFile(filepath.Join(m, "h"))
			if string(b) == "from the view" {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("layer %q: the 9P mount never read the view's write: %q", layerName, b)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}
