package ui

// Hold takes the simulator as a running simulation does, until the
// function returned is called.
func (h *Handler) Hold() func() {
	h.busy <- struct{}{}
	return func() { <-h.busy }
}
