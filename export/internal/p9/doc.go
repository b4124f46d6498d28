// Package p9 is the server half of github.com/hugelgupf/p9 v0.3.0's p9
// package (Apache License 2.0, see LICENSE; copyright the gVisor and p9
// authors), copied for shale's 9P export with these changes, each marked
// "shale:" where made:
//
//   - server.go: a receiving goroutine is counted in pendingWg by the one
//     that starts it. Upstream, a connection that ended while requests
//     were in flight raced stop's Wait against that Add (a data race, and
//     at times the panic "WaitGroup is reused before previous Wait has
//     returned", which killed the server).
//   - handlers.go, server.go: an xattr fid holds a reference to the fid
//     whose File it shares. Upstream it closed that File, and dropped a
//     reference to that fid's parent it never took, when it was clunked:
//     the directory fids above were closed while still in use.
//   - handlers.go: Rattach carries the QID of the file attached, not of
//     the Attacher's root; Trename answers EINVAL where it panicked.
//   - The client, StatToAttr and the buffer pool of the client are left
//     out. Wire format and the File interface are unchanged: upstream's
//     client talks to it.
package p9
