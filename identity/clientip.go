package identity

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
)

// The headers a proxy may name its client in, in the canonical form that
// http.Header keys have.
const (
	headerXFF       = "X-Forwarded-For"
	headerForwarded = "Forwarded"
	headerRealIP    = "X-Real-Ip"
)

// forwardedKind is which header the trusted proxies set.
type forwardedKind uint8

const (
	kindXFF forwardedKind = iota // the default
	kindForwarded
	kindRealIP
)

// parseForwardedHeader reads a forwarded_header value; "" is X-Forwarded-For.
func parseForwardedHeader(s string) (forwardedKind, string, error) {
	switch http.CanonicalHeaderKey(s) {
	case "", headerXFF:
		return kindXFF, headerXFF, nil
	case headerForwarded:
		return kindForwarded, headerForwarded, nil
	case headerRealIP:
		return kindRealIP, headerRealIP, nil
	}
	return 0, "", fmt.Errorf("want X-Forwarded-For, Forwarded or X-Real-IP, got %q", s)
}

// ClientAddr returns the address of r's client: the connection's peer, or,
// when the peer is a trusted proxy, the address the configured forwarded
// header names. For X-Forwarded-For and Forwarded that is the rightmost
// hop that is not itself a trusted proxy; for X-Real-IP, the header's last
// value. A client cannot choose its address by sending the headers: hops
// added by untrusted parties are never reached, and headers other than the
// configured one are never read. A peer outside the trusted proxies that
// sends any of the three headers is counted (see ForwardStats) and logged
// once. The result is invalid when r.RemoteAddr holds no IP address.
func (id *Identity) ClientAddr(r *http.Request) netip.Addr {
	peer := parseHost(r.RemoteAddr)
	if !peer.IsValid() {
		return peer
	}
	if !id.isTrusted(peer) {
		if h := forwardingHeader(r.Header); h != "" {
			id.noteUntrusted(peer, h)
		}
		return peer
	}
	values := r.Header[id.fwdName]
	if len(values) == 0 {
		if h := forwardingHeader(r.Header); h != "" {
			id.noteOtherHeader(peer, h)
		}
		return peer
	}
	switch id.fwdKind {
	case kindForwarded:
		return id.walk(peer, values, forwardedHops)
	case kindRealIP:
		if a := parseHost(values[len(values)-1]); a.IsValid() {
			return a
		}
		return peer
	}
	return id.walk(peer, values, xffHops)
}

// forwardingHeader returns the name of a forwarding header h holds, or "".
func forwardingHeader(h http.Header) string {
	for _, n := range [...]string{headerXFF, headerForwarded, headerRealIP} {
		if len(h[n]) > 0 {
			return n
		}
	}
	return ""
}

// ClientKey returns the descriptor value of r's client: its address grouped
// by the configured prefix ("203.0.113.7", "2001:db8:1:2::/64"), or "" when
// there is none.
func (id *Identity) ClientKey(r *http.Request) string {
	a := id.ClientAddr(r)
	if !a.IsValid() {
		return ""
	}
	return id.group(a)
}

func (id *Identity) isTrusted(a netip.Addr) bool {
	for _, p := range id.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// walk goes through the hops of the header values from the right: each
// trusted hop vouches for the one to its left. It stops at the first hop
// that is not trusted, and at an unreadable one returns the last hop that
// was read.
func (id *Identity) walk(peer netip.Addr, values []string, split func(string) []string) netip.Addr {
	last := peer
	for i := len(values) - 1; i >= 0; i-- {
		hops := split(values[i])
		for j := len(hops) - 1; j >= 0; j-- {
			a := parseHost(hops[j])
			if !a.IsValid() {
				return last
			}
			if !id.isTrusted(a) {
				return a
			}
			last = a
		}
	}
	return last
}

func xffHops(v string) []string { return strings.Split(v, ",") }

// forwardedHops returns the for= values of a Forwarded header (RFC 7239),
// one per element; an element without for= yields "" (unreadable).
func forwardedHops(v string) []string {
	elems := strings.Split(v, ",")
	out := make([]string, 0, len(elems))
	for _, el := range elems {
		var hop string
		for _, pair := range strings.Split(el, ";") {
			k, val, ok := strings.Cut(strings.TrimSpace(pair), "=")
			if ok && strings.EqualFold(strings.TrimSpace(k), "for") {
				hop = strings.Trim(strings.TrimSpace(val), `"`)
				break
			}
		}
		out = append(out, hop)
	}
	return out
}

// parseHost reads an address written as "1.2.3.4", "1.2.3.4:80", "::1",
// "[::1]" or "[::1]:80", dropping any zone and unmapping IPv4-in-IPv6. It
// returns the zero Addr for anything else.
func parseHost(s string) netip.Addr {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Addr{}
	}
	if hasPort(s) {
		// A peer's address, the common case: tried first because a failed
		// ParseAddr costs an allocation.
		if ap, err := netip.ParseAddrPort(s); err == nil {
			return ap.Addr().WithZone("").Unmap()
		}
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return a.WithZone("").Unmap()
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().WithZone("").Unmap()
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.WithZone("").Unmap()
		}
	}
	return netip.Addr{}
}

// hasPort reports whether s may be an address with a port: "[...]..." or
// one colon. No string that ParseAddr reads is one ParseAddrPort reads,
// so trying ParseAddrPort first changes no result.
func hasPort(s string) bool {
	i := strings.IndexByte(s, ':')
	return i >= 0 && (s[0] == '[' || strings.IndexByte(s[i+1:], ':') < 0)
}

// group returns a's network under the configured prefix: the address
// itself for a full-length prefix, else the masked CIDR.
func (id *Identity) group(a netip.Addr) string {
	bits := id.v6bits
	if a.Is4() {
		bits = id.v4bits
	}
	if bits >= a.BitLen() {
		return a.String()
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a.String()
	}
	return p.String()
}

// ForwardStats counts the requests whose forwarding headers were not
// believed because of where they came from: signs of a proxy missing from
// trusted_proxies, a proxy that sets another header than forwarded_header,
// or clients sending the headers themselves.
type ForwardStats struct {
	// Untrusted counts requests from a peer outside trusted_proxies that
	// carried X-Forwarded-For, Forwarded or X-Real-IP. If the peer is a
	// proxy of yours, all its clients share its address and one limit.
	Untrusted uint64
	// OtherHeader counts requests from a trusted proxy that carried no
	// forwarded_header but another of the three: that proxy's clients
	// share its address.
	OtherHeader uint64
}

// ForwardStats returns the counts since the Identity was made. It is safe
// to call concurrently with requests.
func (id *Identity) ForwardStats() ForwardStats {
	return ForwardStats{Untrusted: id.untrusted.n.Load(), OtherHeader: id.otherHeader.n.Load()}
}

// onceCounter counts events and logs the first one.
type onceCounter struct {
	n      atomic.Uint64
	logged atomic.Bool
}

// The messages of the warnings logged once.
const (
	msgUntrusted   = "forwarding header ignored: the peer is not in trusted_proxies"
	msgOtherHeader = "forwarding header ignored: not the forwarded_header"
)

func (id *Identity) noteUntrusted(peer netip.Addr, header string) {
	id.untrusted.n.Add(1)
	if id.untrusted.logged.Load() || !id.untrusted.logged.CompareAndSwap(false, true) {
		return
	}
	id.log.LogAttrs(context.Background(), slog.LevelWarn, msgUntrusted,
		slog.String("peer", peer.String()), slog.String("header", header),
		slog.String("hint", "if the peer is a proxy in front of sluice, add it to trusted_proxies, "+
			"or all its clients share one limit; logged once, counted always"))
}

func (id *Identity) noteOtherHeader(peer netip.Addr, header string) {
	id.otherHeader.n.Add(1)
	if id.otherHeader.logged.Load() || !id.otherHeader.logged.CompareAndSwap(false, true) {
		return
	}
	id.log.LogAttrs(context.Background(), slog.LevelWarn, msgOtherHeader,
		slog.String("peer", peer.String()), slog.String("header", header), slog.String("forwarded_header", id.fwdName),
		slog.String("hint", "if the proxy names its clients in that header, set forwarded_header to it, "+
			"or all its clients share one limit; logged once, counted always"))
}
