package net

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeAcrossClients (issue 23): a header edited in place on client A,
// then make run at once on client B, rebuilds and prints the new result.
// A's edit is a delayed write: the mtime make compares is A's, which the
// server asks A for (or A tells it at its close).
func TestMakeAcrossClients(t *testing.T) {
	for _, tool := range []string{"cc", "make"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is missing", tool)
		}
	}
	_, _, url := cacheServer(t, 0)
	a, b := mount(t, url), mount(t, url)
	writeFile(t, filepath.Join(a, "h.h"), []byte("#define SALT 0\n"), 0o644)
	writeFile(t, filepath.Join(a, "main.c"), []byte("#include <stdio.h>\n#include \"h.h\"\nint main(void) { printf(\"%d\\n\", SALT); return 0; }\n"), 0o644)
	writeFile(t, filepath.Join(a, "Makefile"), []byte("prog: main.o\n\tcc -o prog main.o\nmain.o: main.c h.h\n\tcc -c main.c\n"), 0o644)
	makeOn := func(dir string) string {
		t.Helper()
		cmd := exec.Command("make", "-s")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make on %s: %v\n%s", dir, err, out)
		}
		out, err := exec.Command(filepath.Join(dir, "prog")).CombinedOutput()
		if err != nil {
			t.Fatalf("prog on %s: %v\n%s", dir, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got := makeOn(b); got != "0" {
		t.Fatalf("first build on B printed %q, want 0", got)
	}
	wrong := 0
	const rounds = 5
	for salt := 1; salt <= rounds; salt++ {
		// In place, without truncation (a truncation reaches the
		// server at once): the same length, new bytes.
		c2oWrite(t, filepath.Join(a, "h.h"), os.O_WRONLY, 0, fmt.Sprintf("#define SALT %d\n", salt))
		if got := makeOn(b); got != fmt.Sprint(salt) {
			wrong++
			t.Logf("round %d: make on B built a program printing %q", salt, got)
		}
	}
	if wrong > 0 {
		t.Errorf("%d of %d builds on B after an edit on A printed the old result", wrong, rounds)
	}
}
