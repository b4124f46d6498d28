package layer

// OnSync registers fn to run at every Sync: a watcher of changes made
// beside the stack raises, before fn returns, the events of every change
// made before fn was called.
func (s *Events) OnSync(fn func()) {
	s.mu.Lock()
	s.syncs = append(s.syncs, fn)
	s.mu.Unlock()
}

// Sync raises now the events of the changes made beside the stack before
// it was called (in LOWER, by programs that do not use shale), which
// watchers would otherwise raise a moment later. A server calls it
// before it answers an open, so that the open shows what was done in
// LOWER before it (close-to-open, docs/network.md).
func (s *Events) Sync() {
	s.mu.RLock()
	syncs := s.syncs
	s.mu.RUnlock()
	for _, fn := range syncs {
		fn()
	}
}
