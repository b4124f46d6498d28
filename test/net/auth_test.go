package net

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// oneLine checks that a failed command said one line, containing want.
func oneLine(t *testing.T, what string, out []byte, err error, want string) {
	t.Helper()
	s := strings.TrimSpace(string(out))
	if err == nil || strings.Count(s, "\n") != 0 || !strings.Contains(s, want) {
		t.Errorf("%s: err %v, output %q; want one line with %q", what, err, s, want)
	}
}

func TestKeyAndListen(t *testing.T) {
	lower, _ := lowerTree(t)
	dir := tempDir(t)
	key, other := filepath.Join(dir, "key"), filepath.Join(dir, "other")
	writeFile(t, key, []byte("a key of twenty-four b\n"), 0o600)
	writeFile(t, other, []byte("another key, as long as\n"), 0o600)

	// Off loopback, a key is required.
	out, err := exec.Command(shale, "serve", "--listen", "tcp:0.0.0.0:0", lower).CombinedOutput()
	oneLine(t, "serve on 0.0.0.0 without a key", out, err, "needs --keyfile")

	addr := freePort(t)
	serve(t, addr, "--keyfile", key, lower)
	url := "9p://" + addr + "/"

	mnt := tempDir(t)
	out, err = exec.Command(shale, "mount", url+"?keyfile="+other, mnt).CombinedOutput()
	oneLine(t, "mount with another key", out, err, "authentication failed")
	out, err = exec.Command(shale, "mount", url, mnt).CombinedOutput()
	if err == nil {
		umount(mnt)
		t.Errorf("mount without a key of a keyed export worked: %s", out)
	}
	// A plain 9P client gets nothing either.
	if out, err := exec.Command("diodls", "-s", addr, "-a", "/", "-t", "10").CombinedOutput(); err == nil {
		t.Errorf("diodls without the key listed the export: %s", out)
	}

	m := mount(t, url+"?keyfile="+key)
	if b, err := os.ReadFile(filepath.Join(m, "hello")); err != nil || string(b) != "hello\n" {
		t.Errorf("read through the keyed mount: %q, %v", b, err)
	}
}

// TestIdentity: root on the client acts as nobody unless the export says
// --no-root-squash; other uids act as themselves, checked by the server.
func TestIdentity(t *testing.T) {
	for _, squash := range []bool{true, false} {
		lower, _ := lowerTree(t)
		writeFile(t, filepath.Join(lower, "rootonly"), []byte("x"), 0o600)
		os.Mkdir(filepath.Join(lower, "open"), 0o777)
		os.Chmod(filepath.Join(lower, "open"), 0o777)
		sock := filepath.Join(tempDir(t), "s.sock")
		args := []string{lower}
		if !squash {
			args = []string{"--no-root-squash", lower}
		}
		serve(t, sock, args...)
		m := mount(t, "9p://"+sock)

		err := os.WriteFile(filepath.Join(m, "open", "byroot"), []byte("x"), 0o644)
		if err != nil {
			t.Fatalf("squash %v: create in a 0777 dir: %v", squash, err)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(filepath.Join(lower, "open", "byroot"), &st); err != nil {
			t.Fatal(err)
		}
		wantUid := uint32(0)
		if squash {
			wantUid = 65534
		}
		if st.Uid != wantUid {
			t.Errorf("squash %v: a file root made over 9P belongs to uid %d on the server, want %d", squash, st.Uid, wantUid)
		}
		_, err = os.ReadFile(filepath.Join(m, "rootonly"))
		if squash && err == nil {
			t.Errorf("squashed root read a 0600 root file")
		}
		if !squash && err != nil {
			t.Errorf("unsquashed root: %v", err)
		}

		// uid 65534 on the client: its own permissions, on the server.
		cmd := exec.Command("sh", "-c", "cat "+filepath.Join(m, "rootonly")+"; echo x > "+filepath.Join(m, "open", "bynobody"))
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), "Permission denied") {
			t.Errorf("squash %v: nobody read a 0600 root file: %s", squash, out)
		}
		if err := syscall.Stat(filepath.Join(lower, "open", "bynobody"), &st); err != nil || st.Uid != 65534 {
			t.Errorf("squash %v: nobody's file: uid %d, %v", squash, st.Uid, err)
		}
	}
}
