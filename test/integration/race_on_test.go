//go:build race

package integration

// raceEnabled builds a second coordinator with the race detector when the
// tests run with it (raceCoordinatorBin), so that the runs of concurrent
// clients exercise the real process under -race.
const raceEnabled = true
