// Package weather is sluice's weather suite: tests only, black-box. It
// builds the sluice binary, starts a real redis-server behind a real fault
// injector (toxiproxy, as a library) and one or three `sluice serve`
// processes on it, every flag at its default, and puts the store through
// weather: latency below and above the store timeout, a partition, reset
// connections, a refused port, a trickle of bandwidth, DEBUG SLEEP,
// CLIENT PAUSE, a restart without persistence, a stalled server (SIGSTOP)
// and a CPU-starved one. For each weather, sync mode (exact, lease, async)
// and topology it drives an open load and measures the share of calls of
// clients under their limit that were denied, what one client at several
// times its limit was admitted against the limit and its stated bound,
// errors, and how long after the weather the store decided again.
//
// `go test ./weather` runs a short matrix and asserts the figures of
// issue 31 (docs/stores.md, "Weather"); `go test ./weather -run
// TestWeather -weather.full -v` (scripts/weather.sh) runs the full one and
// prints its table.
package weather
