package rest

// inUse returns the bytes reserved, in all and by src (for the tests).
func (b *memoryBudget) inUse(src string) (int64, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.bySource[src]
}
