package journal

// Read delegations (issue 27): a controller may let a client open a file
// for reading without a Tlopen, as NFSv4's read delegations do, until it
// takes that back. It takes it back before anything else may change the
// file's data or names through it: an open for writing, a truncation, an
// unlink or rename of it. A client holds one only while connected.
//
// A controller grants them only to clients whose hello (a Clean of Qid
// path 0) has Delegates in its Qid.Vers: a client that predates these
// kinds drops everything at a record kind it does not know.
const (
	// Delegate, controller to client: open Qid for reading without
	// asking, until Return. Qid.Vers is the file's version.
	Delegate Kind = 10
	// Return, controller to client: give the delegation of Qid back:
	// open on the server every handle of it open here without one, then
	// send Returned with this record's Seq.
	Return Kind = 11
	// Returned, client to controller: it answers the Return of Qid at
	// Seq (or later): it holds no delegation of Qid, and the server has
	// every open of it.
	Returned Kind = 12
)

// Delegates, in the Qid.Vers of a client's hello: it takes Delegate.
const Delegates uint32 = 2
