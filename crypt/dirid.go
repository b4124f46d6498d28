package crypt

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/shalefs/shale/layer"
)

// Every lower directory holds its ID, 16 random bytes, in a read-only file
// named dirIDName; the wrap template writes it when the layer makes the
// directory (and in the root when it has none) and hands it to EncodeName
// and DecodeName. The ID is the associated data of the directory's names.
// It is not secret: changing it only makes the directory's names fail to
// decode (and so vanish from the view), never decode to other names. The
// leading '.' can never be produced by EncodeName, so the file is hidden.
const (
	dirIDName = ".shale.dirid"
	dirIDSize = 16
)

// DirIDFile is the name of the file that holds a directory's ID.
func (l *Layer) DirIDFile() string { return dirIDName }

// NewDirID makes the ID of a new directory.
func (l *Layer) NewDirID() ([]byte, error) {
	id := make([]byte, dirIDSize)
	rand.Read(id) // never fails (crypto/rand panics on a broken kernel)
	return id, nil
}

// DirIDSize is the length of every directory ID; an ID file of another
// length is damaged.
func (l *Layer) DirIDSize() int { return dirIDSize }

// checkRootID makes sure the root of LOWER, called name, has its ID before
// the layer is stacked. The names in the root are encrypted under it, so a
// lost ID (a backup that skipped dot-files, say) must be restored, never
// replaced: a new one would hide every entry for good. Only a root with no
// entries yet, as version 1's init left it, gets one here (files that
// cannot be entries, as init --force keeps, do not count).
func checkRootID(ctx context.Context, lower layer.Node, name string) error {
	path := lowerPath(name, dirIDName)
	id, err := layer.ReadFile(ctx, lower, dirIDName)
	switch {
	case err == nil && len(id) == dirIDSize:
		return nil
	case err == nil:
		return fmt.Errorf("%s, the root directory's ID, is %d bytes instead of %d: restore it from a backup; without it no name in %s can be decoded", path, len(id), dirIDSize, name)
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("read the root directory's ID: %w", inLower(name, err))
	}
	names, err := layer.ReadDirNames(ctx, lower)
	if err != nil {
		return fmt.Errorf("read %s: %w", name, inLower(name, err))
	}
	for _, n := range names {
		// Encrypted names have their shape (sealedName); long ones and
		// long targets stand in under .shale.L. and .shale.T.; other
		// dot files are temporaries. Any other name never decodes,
		// whatever the ID: files version 1's init --force kept (it left
		// the ID to the first mount), an ext4 root's lost+found.
		_, sealed := sealedName(n)
		if n != ConfigName && (sealed || strings.HasPrefix(n, ".shale.L.") || strings.HasPrefix(n, ".shale.T.")) {
			return fmt.Errorf("%s, the root directory's ID, is missing: restore it from a backup; without it no name in %s can be decoded (shale never makes a new one over existing files)", path, name)
		}
	}
	id, _ = (&Layer{}).NewDirID()
	if err := layer.WriteFileAtomic(ctx, lower, dirIDName, id, 0o444, false); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("write the root directory's ID: %w", inLower(name, err))
	}
	return nil
}
