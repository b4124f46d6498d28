// Package shaletest is what the test packages that run the shale command
// share: building it, once per package, the way CI and users do.
package shaletest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
