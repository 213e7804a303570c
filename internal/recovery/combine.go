package recovery

// CombineXOR returns the XOR of equally long shares (MarbleRun's
// multi-party recovery: the data key is the XOR of every share).
func CombineXOR(shares [][]byte) []byte { return xorCombine(shares) }

// CombineShamir interpolates Shamir shares (y[0..n-1] ‖ x, GF(2^8) with the
// polynomial 0x11B) at x = 0. Given fewer shares than the threshold it
// returns a value unrelated to the secret; callers test the result.
func CombineShamir(shares [][]byte) ([]byte, error) { return shamirCombine(shares) }
