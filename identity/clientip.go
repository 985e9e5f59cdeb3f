package identity

import (
	"net/http"
	"net/netip"
	"strings"
)

// ClientAddr returns the address of r's client: the connection's peer, or,
// when the peer is a trusted proxy, the rightmost address of
// X-Forwarded-For (or, without it, of Forwarded's for= parameters) that is
// not itself a trusted proxy. A client cannot choose its address by sending
// the headers: hops added by untrusted parties are never reached. The
// result is invalid when r.RemoteAddr holds no IP address.
func (id *Identity) ClientAddr(r *http.Request) netip.Addr {
	peer := parseHost(r.RemoteAddr)
	if !peer.IsValid() || !id.isTrusted(peer) {
		return peer
	}
	if xff := r.Header.Values("X-Forwarded-For"); len(xff) > 0 {
		return id.walk(peer, xff, xffHops)
	}
	if fwd := r.Header.Values("Forwarded"); len(fwd) > 0 {
		return id.walk(peer, fwd, forwardedHops)
	}
	return peer
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
