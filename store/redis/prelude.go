package redis

import _ "embed"

// prelude is prelude.lua, the arithmetic and the reading of a state that
// take.lua, lease.lua and async.lua share: each script's text is the
// prelude followed by the script's own (takeScript, leaseSource,
// asyncSource).
//
//go:embed prelude.lua
var prelude string
