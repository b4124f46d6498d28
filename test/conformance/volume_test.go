package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// A volume (etcd and S3, docs/volume.md) is a stack too when the engines
// are given: SHALE_ETCD and SHALE_S3 with the AWS variables, as
// scripts/engines.sh start prints them. Blocks are small so that the
// cases' files span several.
func init() {
	if os.Getenv("SHALE_ETCD") == "" || os.Getenv("SHALE_S3") == "" {
		return
	}
	stacks = append(stacks, &stack{name: "volume", server: formatVolume, differs: volumeDiffers})
}

// formatVolume makes a new volume for st and returns its address.
func formatVolume(st *stack) (string, error) {
	name := fmt.Sprintf("conformance-%d-%d", os.Getpid(), len(st.name))
	lower := "etcd://" + os.Getenv("SHALE_ETCD") + "/" + name
	data := strings.TrimSuffix(os.Getenv("SHALE_S3"), "/") + "/" + name
	out, err := exec.Command(suite.shale, "format", "--block-size", "64KiB", "--data", data, lower).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: shale format: %v\n%s", st.name, err, out)
	}
	return lower, nil
}

// volumeDiffers are what a volume does otherwise than ext4, each for a
// reason docs/volume.md gives.
var volumeDiffers = func() map[string]string {
	m := map[string]string{}
	add := func(why string, c string, keys ...string) {
		for _, k := range keys {
			m[c+"/"+k] = why
		}
	}
	_ = add
	return m
}()
