//go:build race

package request

// raceEnabled: the race detector's instrumentation allocates on its own,
// so allocation counts are measured without it (the Go standard library's
// tests skip them so too).
const raceEnabled = true
