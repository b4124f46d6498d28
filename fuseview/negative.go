package fuseview

import "sync"

// Negative entries. The kernel keeps a LOOKUP's "no such name" for as
// long as names (an hour when coherent), so that a program probing for a
// missing file (a search path, a lock file, a shell's hash table) asks
// once. A view keeps, per directory, the names it told the kernel are
// missing, and drops the kernel's entry when a change anywhere names one
// of them (holder.go): only those, so names made through other views
// that this kernel never asked for cost it nothing.
type negatives struct {
	mu    sync.Mutex
	names map[string]negState
}

type negState uint8

const (
	negLooking negState = iota + 1 // a LOOKUP is at work on the name
	negRaced                       // and the name changed meanwhile
	negHeld                        // the kernel may keep it missing
)

// maxNegatives bounds the names kept per directory; past it a missing
// name is not kept by the kernel either.
const maxNegatives = 1024

// looking notes a LOOKUP of name at work.
func (n *negatives) looking(name string) {
	n.mu.Lock()
	if n.names == nil {
		n.names = make(map[string]negState)
	}
	n.names[name] = negLooking
	n.mu.Unlock()
}

// found ends the LOOKUP of name and reports whether the kernel may keep
// it missing: it is missing, it did not change while we looked (what we
// found may be older than the change, whose notification came before the
// kernel had the entry), and there is room to remember it.
func (n *negatives) found(name string, missing bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !missing || n.names[name] == negRaced || len(n.names) > maxNegatives {
		delete(n.names, name)
		return false
	}
	n.names[name] = negHeld
	return true
}

// changed tells of a change of name: it reports whether the kernel may
// hold it missing, and forgets it.
func (n *negatives) changed(name string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch n.names[name] {
	case negLooking:
		n.names[name] = negRaced
	case negHeld:
		delete(n.names, name)
		return true
	}
	return false
}

// made forgets name, made through the view: the kernel's entry is its
// own reply's.
func (n *negatives) made(name string) {
	n.mu.Lock()
	delete(n.names, name)
	n.mu.Unlock()
}

// all is changed for every name: it returns those the kernel may hold.
func (n *negatives) all() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var held []string
	for name, s := range n.names {
		if s == negHeld {
			held = append(held, name)
			delete(n.names, name)
		} else {
			n.names[name] = negRaced
		}
	}
	return held
}
