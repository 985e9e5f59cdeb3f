package observe

import "time"

// clockResolution is how often the Watcher's own clock (a
// coarseclock.Clock) reads the system clock: the windows' slots are 10 s,
// so a reading up to 100 ms late places a count in the wrong slot only
// within 100 ms of a slot's end, and reading the system clock for every
// decision would cost more than the rest of the counting (about 50 ns of
// 125 on the machine measured).
const clockResolution = 100 * time.Millisecond
