package objstore

const none = ^uint32(0)

type link struct{ newer, older uint32 }

// list is a doubly linked list of ids from newest (head) to oldest (tail),
// kept in a chunked array indexed by id: 8 bytes an object, no pointers for
// the garbage collector to chase.
type list struct {
	links      chunked[link]
	head, tail uint32
}

func newList() list { return list{head: none, tail: none} }

func (l *list) at(id uint32) *link { return l.links.at(id) }

func (l *list) pushHead(id uint32) {
	l.links.grow(id)
	*l.links.at(id) = link{newer: none, older: l.head}
	if l.head != none {
		l.links.at(l.head).newer = id
	} else {
		l.tail = id
	}
	l.head = id
}

func (l *list) unlink(id uint32) {
	k := *l.links.at(id)
	if k.newer != none {
		l.links.at(k.newer).older = k.older
	} else {
		l.head = k.older
	}
	if k.older != none {
		l.links.at(k.older).newer = k.newer
	} else {
		l.tail = k.newer
	}
}

func (l *list) walk(fn func(id uint32)) {
	for id := l.tail; id != none; id = l.links.at(id).newer {
		fn(id)
	}
}
