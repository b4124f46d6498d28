package wrap

import (
	"context"

	"github.com/shalefs/shale/layer"
)

// The hooks a layer may provide. Each is a small optional interface, as in
// go-fuse's fs package: New looks for each one on the value it is given,
// and what is not there passes through unchanged.

// BlockCodec transforms file data block by block. A plaintext block of
// BlockSize bytes (shorter only at the end of a file) is stored as that
// many bytes plus Overhead. The template finds a block's place in the lower
// file, reads, modifies and writes partial blocks, and translates sizes.
type BlockCodec interface {
	BlockSize() int
	Overhead() int
	// EncodeBlock appends the stored form of plain, block blk of the file
	// whose header is hdr, to dst.
	EncodeBlock(dst []byte, hdr []byte, blk uint64, plain []byte) ([]byte, error)
	// DecodeBlock appends the plaintext of stored to dst. An error makes
	// the read fail with EIO.
	DecodeBlock(dst []byte, hdr []byte, blk uint64, stored []byte) ([]byte, error)
}

// FileHeader gives every non-empty lower file a header of HeaderSize bytes
// before its first block, made when the file gets its first data. It is
// what BlockCodec receives as hdr: the file's identity (a random file ID).
type FileHeader interface {
	HeaderSize() int
	NewHeader() ([]byte, error)
	// CheckHeader vets a header read from the lower file.
	CheckHeader(hdr []byte) error
}

// NameCodec maps names between the views, per directory. dir is the
// directory's identity from DirIDer (nil without one). A lower name that
// does not decode is hidden from listings (the layer's own files, or
// names put there behind its back).
type NameCodec interface {
	EncodeName(dir []byte, name string) (string, error)
	DecodeName(dir []byte, lower string) (string, error)
}

// DirIDer gives directories an identity for NameCodec: random bytes the
// template keeps in a file of each lower directory, named DirIDFile (a name
// DecodeName refuses, so it stays hidden), written when the layer makes the
// directory. The root's must be there before New: the layer writes it when
// it sets up a lower directory.
type DirIDer interface {
	DirIDFile() string
	NewDirID() ([]byte, error)
	// DirIDSize is the length of every identity: a file of another
	// length is damaged.
	DirIDSize() int
}

// LinkCodec maps symlink targets, of at most 4095 bytes as in Linux. A
// stored form too long for a lower symlink is kept in a sidecar in the
// root directory, named by its hash, and removed with the symlink's last
// link (names.go): so stored forms must never repeat (a random nonce sees
// to it), nor start with ".shale.", and the NameCodec must hide names that
// do. LinkSize gives a target's length from its stored length, for stat,
// which must not read the link (that would change its access time).
type LinkCodec interface {
	EncodeLink(target []byte) ([]byte, error)
	DecodeLink(stored []byte) ([]byte, error)
	LinkSize(stored uint64) uint64
}

// SetattrChecker may refuse an attribute change before it reaches the
// lower layer (e.g. setuid on root-owned files).
type SetattrChecker interface {
	CheckSetattr(ctx context.Context, current *layer.Attr, in *layer.SetAttr) layer.Errno
}

// XattrCodec maps extended attributes. Names it does not take pass
// through unchanged (say ACLs and security labels, which the lower kernel
// acts on). The others are stored under lower names and values it
// encodes, bound to the file's identity: XattrIDSize random bytes from
// NewXattrID, which the template keeps in the file's lower attribute
// XattrIDName (made at the first attribute set; hidden from listings; one
// of another length is damaged). A name whose encoding is longer than the
// lower file system takes (255 bytes) cannot be set (ERANGE). Taken
// trusted.* names are kept from callers other than root, as Linux does,
// since the lower file system no longer can.
type XattrCodec interface {
	TakesXattr(name string) bool
	XattrIDName() string
	XattrIDSize() int
	NewXattrID() ([]byte, error)
	EncodeXattrName(id []byte, name string) (string, error)
	// DecodeXattrName fails for lower names that are not the codec's;
	// they are hidden.
	DecodeXattrName(id []byte, lower string) (string, error)
	SealXattr(id []byte, name string, value []byte) ([]byte, error)
	// OpenXattr fails (EIO) for a value altered or moved from another
	// name or file.
	OpenXattr(id []byte, name string, stored []byte) ([]byte, error)
}
