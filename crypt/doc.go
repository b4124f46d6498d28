// Package crypt is Cryptfs made sound: a layer that encrypts file contents,
// names and symlink targets with authenticated encryption, on the wrap
// template.
//
//   - File data: AES-256-GCM per 4 KiB block with a random 128-bit nonce,
//     the file's random 16-byte ID (from its header) and the block number
//     bound in as associated data, so a block cannot be altered, moved to
//     another offset or another file, or cut short without the read failing.
//   - Names: AES-SIV (RFC 5297), deterministic so lookups work, with the
//     directory's random ID as associated data, then unpadded base64url.
//   - Symlink targets: AES-256-GCM with a random nonce, base64url; those
//     too long for a lower symlink in a sidecar named by their hash (wrap).
//   - Keys: one random 256-bit master key, wrapped in LOWER/shale.conf
//     under a key derived from the passphrase with scrypt; the content,
//     name and link keys are derived from it with HKDF-SHA256.
//
// The byte-level format, with known-answer vectors, is docs/crypt-format.md.
package crypt
