package cache

// PutName keeps that name in directory dir is child, as a walk found
// it, unless something touched dir since snapshot since. It gives no
// attributes and no right to search dir: a Lookup still asks the server;
// ChildOf answers.
func (c *Cache) PutName(since, dir uint64, name string, child uint64) {
	if !c.On.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changedLocked(dir, since) {
		return
	}
	d := c.entLocked(dir, 0)
	if d.names == nil {
		d.names = map[string]uint64{}
	}
	d.names[name] = child
}
