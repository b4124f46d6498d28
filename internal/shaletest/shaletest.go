// Package shaletest is what the test packages that run the shale command
// share: building it, once per package, the way CI and users do.
package shaletest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// Build builds cmd/shale into dir (CGO_ENABLED=0, as scripts/setup.sh
// does) and returns the binary's path. It works from any directory of the
// module, which go test makes a package's own.
func Build(dir string) (string, error) {
	bin := filepath.Join(dir, "shale")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/shalefs/shale/cmd/shale")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building shale: %v\n%s", err, out)
	}
	return bin, nil
}

// InitCrypt makes lower a crypt directory, as `shale init` does, with
// the passphrase in file pass and a cheap key derivation, and returns the
// mount arguments that give the passphrase.
func InitCrypt(shale, lower, pass string) ([]string, error) {
	if err := os.WriteFile(pass, []byte("shale tests\n"), 0o600); err != nil {
		return nil, err
	}
	out, err := exec.Command(shale, "init", "--layer", "crypt", "--passfile", pass, "--scrypt-logn", "10", lower).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("shale init: %v: %s", err, out)
	}
	return []string{"--passfile", pass}, nil
}

// RaiseNoFile lets the calling process hold n descriptors (tests that
// open a thousand connections); it returns the limit it got.
func RaiseNoFile(n uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= n {
		return l.Cur, nil
	}
	l.Cur = min(n, l.Max)
	err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
	return l.Cur, err
}
