package main

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall: scripts/install.sh into a DESTDIR puts the command, manual
// pages that groff renders without a warning, the mount(8) helper and the
// unit template where a distribution would; uninstall takes them away.
func TestInstall(t *testing.T) {
	dest := t.TempDir()
	script, _ := filepath.Abs("../../scripts/install.sh")
	install := func(what string) {
		t.Helper()
		cmd := exec.Command(script, what)
		cmd.Env = append(os.Environ(), "DESTDIR="+dest, "PREFIX=/usr")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("install.sh %s: %v: %s", what, err, out)
		}
	}
	install("install")
	if out, err := exec.Command(filepath.Join(dest, "usr/bin/shale"), "version").Output(); err != nil || !strings.HasPrefix(string(out), "shale ") {
		t.Errorf("the installed shale version: %q %v", out, err)
	}
	man := filepath.Join(dest, "usr/share/man/man1")
	for page, want := range map[string]string{
		"shale.1":        "shale-mount(1)",
		"shale-mount.1":  `\fB--nonempty\fP`,
		"shale-serve.1":  `\fB--log-level\fP`,
		"shale-umount.1": "end a shale mount",
	} {
		b, err := os.ReadFile(filepath.Join(man, page))
		if err != nil || !bytes.Contains(b, []byte(want)) {
			t.Errorf("%s: %v; want it to say %q", page, err, want)
		}
	}
	pages, _ := filepath.Glob(filepath.Join(man, "*.1"))
	for _, p := range pages {
		cmd := exec.Command("groff", "-man", "-Tutf8", "-ww", "-z", p)
		if out, err := cmd.CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("groff %s: %v: %s", filepath.Base(p), err, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dest, "usr/lib/systemd/system/shale@.service")); err != nil ||
		!strings.Contains(string(b), "\nExecStart=/usr/bin/shale mount -f --stack /etc/shale/%i.toml\n") {
		t.Errorf("shale@.service: %v: %s", err, b)
	}
	if b, err := os.ReadFile(filepath.Join(dest, "usr/lib/systemd/system/shale-serve@.service")); err != nil ||
		!strings.Contains(string(b), "\nExecStart=/usr/bin/shale serve --stack /etc/shale/%i.toml $SERVE_FLAGS\n") {
		t.Errorf("shale-serve@.service: %v: %s", err, b)
	}
	if l, err := os.Readlink(filepath.Join(dest, "sbin/mount.shale")); err != nil || l != "/usr/bin/shale" {
		t.Errorf("mount.shale links to %q (%v)", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dest, "etc/shale")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("/etc/shale: %v %v", fi, err)
	}
	install("uninstall")
	filepath.WalkDir(dest, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			t.Errorf("left after uninstall: %s", p)
		}
		return nil
	})
}

// TestMountHelper: mount(8) runs /sbin/mount.shale (install.sh's link to
// shale) for type shale, as "mount.shale LOWER MNT -o OPTIONS", the form
// shale takes. In a mount namespace whose /usr/sbin has the link in an
// overlay.
func TestMountHelper(t *testing.T) {
	dir, lower, mnt := lowerAndMnt(t)
	os.WriteFile(filepath.Join(lower, "f"), []byte("uryyb\n"), 0o644)
	up, work := filepath.Join(dir, "up"), filepath.Join(dir, "work")
	os.Mkdir(up, 0o755)
	os.Mkdir(work, 0o755)
	if err := os.Symlink(shaleBin, filepath.Join(up, "mount.shale")); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "sh", "-c", `mount --make-rprivate / &&
		mount -t overlay overlay -o lowerdir=/usr/sbin,upperdir="$0",workdir="$1" /usr/sbin &&
		mount -t shale "$2" "$3" -o layer=rot13,nosuid,nodev && cat "$3/f" && umount "$3"`, up, work, lower, mnt)
	if code, out := runCmd(t, cmd); code != 0 || out != "hello\n" {
		t.Errorf("mount -t shale: exit %d: %q", code, out)
	}
}
