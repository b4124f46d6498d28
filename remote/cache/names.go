package cache

// PutName keeps that name in directory dir is child, as a walk found
// it, unless something touched dir since snapshot since. It gives no
// attributes and no right to search dir: a Lookup still asks the server;
// ChildOf answers.
func (c *Cache) PutName(since, dir uint64, name string, child uint64) {
	c.put(since, dir, 0, func(d *centry) {
		if d.names == nil {
			d.names = map[string]uint64{}
		}
		d.names[name] = child
	})
}
