package conformance

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/shalefs/shale/internal/shaletest"
)

// A volume (etcd and S3, docs/volume.md) is a stack too when the engines
// are given: SHALE_ETCD and SHALE_S3 with the AWS variables, as
// scripts/engines.sh start prints them. Blocks are small so that the
// cases' files span several.
func init() {
	if os.Getenv("SHALE_ETCD") == "" || os.Getenv("SHALE_S3") == "" {
		return
	}
	stacks = append(stacks,
		&stack{name: "volume", server: formatVolume, differs: volumeDiffers},
		// crypt over a volume: the bucket and etcd hold only ciphertext.
		&stack{name: "volume-crypt", layers: []string{"crypt"}, prepare: passfile, server: cryptVolume, differs: merge(volumeDiffers, cryptDiffers)})
}

// passfile gives the mount crypt's passphrase, which cryptVolume sets.
func passfile(lower string) ([]string, error) {
	return []string{"--passfile", filepath.Join(filepath.Dir(lower), "pass")}, nil
}

// cryptVolume formats a volume and makes it a crypt directory.
func cryptVolume(st *stack) (string, error) {
	lower, err := formatVolume(st)
	if err != nil {
		return "", err
	}
	_, err = shaletest.InitCrypt(suite.shale, lower, filepath.Join(filepath.Dir(st.lower), "pass"))
	return lower, err
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
	add("an object store has no fixed size and nothing to reserve: statfs reports a large fixed size in blocks of the volume's block size, and fallocate sets the size but allocates nothing (docs/volume.md)",
		"statfs", "bsize", "frsize", "blocks", "files", "64 MiB allocated shows in bfree")
	add("an object store has nothing to reserve: fallocate sets the size, st_blocks counts stored bytes, and holes are found by blocks of the volume (64 KiB here), not 4 KiB pages (docs/volume.md)",
		"fallocate", "blocks", "blocks grew", "blocks after punch", "SEEK_HOLE", "SEEK_DATA after hole")
	add("holes are found by blocks of the volume (64 KiB here): the block of the last data is data to its end (docs/volume.md)",
		"sparse-5GiB", "SEEK_DATA after last data", "SEEK_HOLE after data")
	add("extended attribute values may be 64 KiB each (Linux's XATTR_SIZE_MAX), where ext4 keeps all of a file's in one 4 KiB block",
		"xattr", "set 4000 bytes", "get 4000 bytes", "set 4096 bytes", "get 4096 bytes", "set 65536 bytes", "get 65536 bytes", "largest user.max value")
	return m
}()
