// Package wrap is the template layers are written on, after Wrapfs: a
// layer is a few hooks, and wrap does the rest once.
//
// A layer is a set of Hooks, each one of the small interfaces in hooks.go;
// New stacks them over a lower layer.Node of a stack:
//
//   - BlockCodec transforms file data a block at a time. wrap reads,
//     modifies and writes partial blocks, keeps holes (a block stored as
//     all zeros reads as zeros, unless FillHoles stores every block
//     encoded), truncates and extends, and translates sizes when blocks
//     grow by an overhead.
//   - FileHeader puts a header (the file's identity) before the first block.
//   - NameCodec maps names per directory, with DirIDer for the directory's
//     identity; names too long for the lower file system are stored under
//     a hashed stand-in with a sidecar; lower names that do not decode are
//     hidden.
//   - LinkCodec maps symlink targets; stored forms too long for a lower
//     symlink go into sidecars, as long names do. SetattrChecker vets
//     attribute changes. XattrCodec maps the extended attributes it takes
//     (names and values, bound to a per-file identity).
//
// Everything else — links, renames (with RENAME_NOREPLACE and _EXCHANGE),
// other extended attributes, locks, statfs — passes through. The smallest layer,
// rot13 (package rot13), is a BlockCodec of a dozen lines:
//
//	type codec struct{}
//
//	func (codec) BlockSize() int { return 4096 }
//	func (codec) Overhead() int  { return 0 }
//	func (codec) EncodeBlock(dst, hdr []byte, blk uint64, p []byte) ([]byte, error) {
//		for _, c := range p {
//			dst = append(dst, rot13(c))
//		}
//		return dst, nil
//	}
//	func (c codec) DecodeBlock(dst, hdr []byte, blk uint64, s []byte) ([]byte, error) {
//		return c.EncodeBlock(dst, hdr, blk, s)
//	}
//
//	root, err := wrap.New(ctx, st, lower, wrap.Hooks{Blocks: codec{}})
//
// and registered by name, so that specs and the command line can stack it
// (stack.Register, in the layer package's init).
//
// A layer that changes no sizes and no names keeps the lower node's token
// (it is simply-named). Data of a layer with a BlockCodec never goes
// through FUSE passthrough: the kernel would read the stored bytes.
package wrap
