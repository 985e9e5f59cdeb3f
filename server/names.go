package server

import (
	"github.com/sluicehq/sluice/decide"
	"github.com/sluicehq/sluice/store/stack"
	"github.com/sluicehq/sluice/transport/respond"
)

// The types and parsers of Config's fields that its components define,
// named here so that cmd/sluice reads its flags and variables knowing
// server alone (an arrow of DESIGN.md's package table).

// Fail is Config.Fail's type: decide.Fail.
type Fail = decide.Fail

// ParseFail reads a fail mode by its name: open, closed or local
// (decide.ParseFail).
func ParseFail(s string) (Fail, error) { return decide.ParseFail(s) }

// Headers is Config.ResponseHeaders' type: respond.Headers.
type Headers = respond.Headers

// ParseHeaders reads a list of response header vocabularies
// (respond.ParseHeaders).
func ParseHeaders(s string) (Headers, error) { return respond.ParseHeaders(s) }

// Peer is a peer region of Config.Store.Peers: stack.Peer.
type Peer = stack.Peer

// Redact returns a store or rules URL with its password masked, as logs
// and errors show it.
func Redact(rawURL string) string { return stack.Redact(rawURL) }
