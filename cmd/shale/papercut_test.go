package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNetworkPapercuts: the error lines of 9P mounts and of serve speak of
// what the user gave and say what to do: no query the flags added, the
// flag a bad size came from, a shell-quoted init command, diod's two
// slashes, a busy port; and serve says that it squashes root.
func TestNetworkPapercuts(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	nobody := freePort(t)
	code, out := run(t, "mount", "9p://"+nobody+"/", mnt)
	wantOneLineError(t, code, out, "lower directory 9p://"+nobody+"/: 9p server at tcp:"+nobody+" cannot be reached")
	if strings.Contains(out, "cachesize") {
		t.Errorf("the error shows the query the flags added: %s", out)
	}
	code, out = run(t, "mount", "--cache-size", "lots", "9p://"+nobody+"/", mnt)
	wantExit(t, code, out, exitUsage, "shale: --cache-size lots: want a size such as 256MiB")

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	code, out = run(t, "serve", "--listen", "tcp:"+busy.Addr().String(), lower)
	wantOneLineError(t, code, out, "the address is in use (another shale serve? shale status lists them")

	sock := filepath.Join(dir, "sock")
	log := filepath.Join(dir, "serve.log")
	t.Cleanup(func() { os.Remove(markerPath("unix:"+sock, lower)) })
	startServe(t, log, "--listen", "unix:"+sock, lower)
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "--no-root-squash lets it act as root") {
		t.Errorf("serve does not say that it squashes root:\n%s", b)
	}
	pass := filepath.Join(dir, "pass")
	os.WriteFile(pass, []byte("pass\n"), 0o600)
	url := "9p://" + sock + "?timeout=30s"
	code, out = run(t, "mount", "--layer", "crypt", "--passfile", pass, url, mnt)
	wantOneLineError(t, code, out, "make one with: shale init --layer crypt '"+url+"'\n")
	if strings.Contains(out, "cachesize") {
		t.Errorf("the error shows the query the flags added: %s", out)
	}
	code, out = run(t, "mount", "9p://"+sock+"?aname=work", mnt)
	wantOneLineError(t, code, out, `refused to attach "work" as uid 0 (no such file or directory): check the tree's name (the URL's path, or ?aname= on a unix socket) (a server such as diod names its trees by absolute path: 9p://HOST:PORT//work, two slashes)`)
}
