//go:build race

package integration

// raceEnabled builds the coordinator with the race detector when the tests
// run with it, so concurrent requests exercise the server under -race.
const raceEnabled = true
