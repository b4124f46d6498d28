package crypt

import "crypto/rand"

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
