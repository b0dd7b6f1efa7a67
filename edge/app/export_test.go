package app

// Addrs returns the addresses the edge serves on.
func (e *Edge) Addrs() Addrs { return e.addrs }
