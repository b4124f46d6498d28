package journal

// Read delegations (issue 27): a controller may let a client open a file
// for reading without a Tlopen, as NFSv4's read delegations do, until it
// takes that back. It takes it back before anything else may change the
// file's data or names through it: an open for writing, a truncation, an
// unlink or rename of it. A client holds one only while connected.
//
// The grant is a bit of an open's answer (Delegated in the QID version
// of Rlopen), so that it costs nothing; a controller sets it only for
// clients whose hello (a Clean of Qid path 0) has Delegates in its
// Qid.Vers: a client that predates them would take the bit for part of
// the version, and drops everything at a record kind it does not know.
const (
	// Return, controller to client: give the delegation of Qid back:
	// open on the server every handle of it open here without one, then
	// send Returned with this record's Seq.
	Return Kind = 10
	// Returned, client to controller: it answers the Return of Qid at
	// Seq (or later): it holds no delegation of Qid, and the server has
	// every open of it.
	Returned Kind = 11
)

// Delegates, in the Qid.Vers of a client's hello: it takes delegations.
const Delegates uint32 = 2

// Delegated, in the QID version of an open's answer: the opener holds a
// read delegation of the file from then on.
const Delegated uint32 = 1 << 30

// VersionOf is the file's version in an open's QID version.
func VersionOf(v uint32) uint32 { return v &^ (NoCache | Delegated) }
