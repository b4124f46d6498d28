// Package shard is Usenetfs made a shale layer: a huge flat directory is
// kept, beneath, in hashed subdirectories ("buckets"), while users see one
// flat directory.
//
// Marking. A directory is managed when it has the setuid bit, as in the
// paper: "chmod u+s DIR" converts it, "chmod u-s DIR" converts it back.
// The bit means nothing for directories on Linux, only the owner (or root)
// may set it, ls -ld shows it, and it is stored in the lower directory's
// own mode, so the mark travels with the directory. Any directory beneath
// with the setuid bit is managed. Only a mode without the bit unmarks: a
// chown that clears it beneath (POSIX allows that) has it set again.
//
// Layout. The lower directory of a managed directory holds only buckets,
// named ".shard-000" to ".shard-3ff"; the entry NAME lives in bucket
// xxhash64(NAME)>>54. Buckets are made when first needed, with the
// managed directory's owner, group and permission bits (without the mark),
// so that the lower tree reads the same to someone looking at it directly.
// Everything else passes through: file data (FUSE passthrough still
// applies), attributes, xattrs, links, tokens. Subdirectories of a managed
// directory are ordinary until marked themselves.
//
// Listing. A managed directory's stream lists ".", "..", then bucket after
// bucket, each bucket read whole and ordered by the low 52 bits of its
// names' hashes. An entry's offset is (bucket+1)<<52 | those 52 bits: it
// depends on the name alone, so a stream resumes at any offset it handed
// out (telldir/seekdir, READDIR across requests) with no per-stream table,
// and creates or deletes elsewhere in the directory never make a surviving
// entry appear twice or go missing.
//
// Conversion is crash-safe: marking sets the bit first and then renames
// each entry into its bucket; unmarking renames entries out, removes the
// buckets and clears the bit last. A managed directory whose lower level
// still holds entries that are not buckets ("strays", left by a crash or
// put there beside shale) shows them, and shale finishes the conversion
// the next time the directory is used. See docs/shard.md.
package shard
