package tunnel

// GateCounts returns the tunnel opens passed on to the journal, those passed on late, those coalesced away
// with their close, and those held back now.
func (s *Server) GateCounts() (passed, late, coalesced int64, heldBack int) {
	c, n := s.gate.snapshot()

	return c.Passed, c.Late, c.Coalesced, n
}
