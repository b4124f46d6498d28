package objstore

import "fmt"

// Policy chooses which object to evict when the store is full. Objects are
// named by the index's small dense ids, which are reused after Remove.
type Policy interface {
	Add(id uint32)           // a new object
	Hit(id uint32)           // a read found the object
	Remove(id uint32)        // the object left the store (removed or evicted)
	Victim() (uint32, bool)  // the object to evict next; the store then calls Remove
	Walk(fn func(id uint32)) // every object, oldest first, so a reload can keep the order
}

// DefaultPolicy is the policy a store uses unless told otherwise.
const DefaultPolicy = "sieve"

// newPolicy returns the policy with the given name.
func newPolicy(name string) (Policy, error) {
	switch name {
	case "", "sieve":
		return newSieve(), nil
	case "lru":
		return newLRU(), nil
	}
	return nil, fmt.Errorf("unknown replacement policy %q: use sieve or lru", name)
}
