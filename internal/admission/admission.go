// Package admission bounds what one source address can take of a server,
// so that a single address cannot take all of it: its connections (Listener,
// below TLS) and its requests in progress (Gate). At the cap of all
// connections a newcomer is admitted fairly: it takes the place of an idle
// connection of the address that holds the most, as long as that address
// holds clearly more than the newcomer's. docs/http.md ("Connections and
// sources") describes the rules as the Client API applies them.
package admission

import (
	"net"
	"net/netip"
)

// Source is the key of the address a connection comes from: an IPv4
// address as it is, an IPv6 address by its /64 prefix (one host or
// subnet usually holds a whole /64), anything else by its string.
func Source(addr net.Addr) string {
	if a, ok := addr.(*net.TCPAddr); ok {
		return sourceOf(a.AddrPort().Addr())
	}
	if addr == nil {
		return ""
	}
	return SourceOf(addr.String())
}

// SourceOf is Source for a "host:port" string, as in
// http.Request.RemoteAddr.
func SourceOf(hostport string) string {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return hostport
	}
	return sourceOf(ap.Addr())
}

func sourceOf(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is6() {
		p, err := ip.WithZone("").Prefix(64)
		if err == nil {
			return p.String()
		}
	}
	return ip.String()
}
