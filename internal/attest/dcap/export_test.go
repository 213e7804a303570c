package dcap

// CachedCollaterals is the number of collaterals whose checks are kept.
func CachedCollaterals() int {
	checkedCollaterals.Lock()
	defer checkedCollaterals.Unlock()
	return len(checkedCollaterals.m)
}

// ForgetCollaterals empties the cache.
func ForgetCollaterals() {
	checkedCollaterals.Lock()
	defer checkedCollaterals.Unlock()
	clear(checkedCollaterals.m)
}
