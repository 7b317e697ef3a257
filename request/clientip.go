package request

import (
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// UnknownClient is the key of a request whose TCP peer is not an address (which
// Traefik does not produce for TCP entrypoints). Such requests share one bucket
// rather than escaping the per-IP layers.
const UnknownClient = "unknown"

// maxForwardedEntries bounds the X-Forwarded-For walk: a longer chain is
// treated as malformed past this many entries from the right.
const maxForwardedEntries = 32

// Resolver finds the client address of a request. It is immutable once built
// (but for its cache) and safe for concurrent use.
type Resolver struct {
	Proxies    []netip.Prefix // trusted proxies; used when Hops == 0
	Hops       int            // > 0: the client is the Hops-th X-Forwarded-For entry from the right
	IPv6Prefix int            // IPv6 clients are keyed by their prefix of this many bits
	Cache      *KeyCache      // never nil (NewKeyCache)
}

// KeyCache remembers the keys Resolve found for a peer host and one
// X-Forwarded-For line. The key is a function of those two and the
// resolver's settings, so a cached key is the key; and behind a proxy every
// request carries the header, whose walk (parsing, each address tested
// against every trusted range) costs hundreds of allocations under Yaegi
// where a hit costs a map lookup. A sync.Map, since under Yaegi each call
// into compiled code costs, and a hit is one call where a mutex takes two.
// Bounded: full, it starts over.
type KeyCache struct {
	keys sync.Map // string (peer host and line) to string (key)

	mu sync.Mutex // guards n, the entries stored since the cache started over
	n  int
}

// maxCachedKeys bounds KeyCache: a few hundred KiB at most.
const maxCachedKeys = 4096

// NewKeyCache returns an empty cache.
func NewKeyCache() *KeyCache {
	return &KeyCache{}
}

// Resolve is the client's key for everything but the common case, which
// the root's generated paths read from RemoteAddr themselves (paths.tmpl:
// client-ip). A request with
// one X-Forwarded-For line is looked up in the cache by its peer host (the
// port differs per connection) and that line.
func Resolve(r *Resolver, req *http.Request) string {
	if fwd := req.Header["X-Forwarded-For"]; len(fwd) == 1 {
		if key, ok := r.Cache.keys.Load(req.RemoteAddr[:strings.LastIndexByte(req.RemoteAddr, ':')+1] + fwd[0]); ok {
			return key.(string)
		}
	}

	return resolveMiss(r, req)
}

// resolveMiss resolves the key of a request Resolve did not find in the
// cache, and caches it when the request has one X-Forwarded-For line; a
// function of its own so that a hit does not pay for its frame (doc.go:
// frames).
func resolveMiss(r *Resolver, req *http.Request) string {
	forwarded := req.Header["X-Forwarded-For"]
	key := resolveAddr(r, req.RemoteAddr, forwarded)
	if len(forwarded) == 1 {
		put(r.Cache, req.RemoteAddr[:strings.LastIndexByte(req.RemoteAddr, ':')+1]+forwarded[0], key)
	}

	return key
}

func put(c *KeyCache, ck, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if c.n >= maxCachedKeys {
		c.keys.Range(func(k, _ interface{}) bool {
			c.keys.Delete(k)
			return true
		})
		c.n = 0
	}

	c.keys.Store(ck, key)
	c.n++
}

// resolveAddr is the key of the client of a request from remoteAddr with
// these X-Forwarded-For lines.
func resolveAddr(r *Resolver, remoteAddr string, forwarded []string) string {
	a, ok := ClientAddr(r, remoteAddr, forwarded)
	if !ok {
		return UnknownClient
	}

	return keyOf(r, a)
}

// keyOf returns the bucket key of a client address.
func keyOf(r *Resolver, a netip.Addr) string {
	if a.Is4() || r.IPv6Prefix >= 128 {
		return a.String()
	}

	p, err := a.Prefix(r.IPv6Prefix)
	if err != nil {
		return a.String()
	}

	return p.String()
}

// ClientAddr resolves the client from the TCP peer and the X-Forwarded-For
// header values, as README.md states: X-Forwarded-For is read only when the
// peer is a trusted proxy (or hops is set), from the right, and a malformed
// entry ends the walk at the last good address.
func ClientAddr(r *Resolver, remoteAddr string, forwarded []string) (netip.Addr, bool) {
	peer, ok := parseHost(remoteAddr)

	if r.Hops > 0 {
		return nthFromRight(r, peer, ok, forwarded)
	}

	if !ok {
		return netip.Addr{}, false
	}

	if len(forwarded) == 0 || !trusted(r, peer) {
		return peer, true
	}

	last := peer
	hops, _ := fromRight(forwarded, maxForwardedEntries)

	for _, a := range hops {
		if !trusted(r, a) {
			return a, true
		}

		last = a
	}

	// Every hop is a trusted proxy (or the walk ended at a malformed entry or
	// the bound): the last good address is the closest we know to the client.
	return last, true
}

// nthFromRight implements trustedHops: the Hops-th X-Forwarded-For entry from
// the right, or the peer when the header has fewer entries. A malformed entry
// before the nth ends the walk at the last good address.
func nthFromRight(r *Resolver, peer netip.Addr, peerOK bool, forwarded []string) (netip.Addr, bool) {
	hops, malformed := fromRight(forwarded, r.Hops)

	switch {
	case len(hops) == r.Hops:
		return hops[r.Hops-1], true
	case malformed && len(hops) > 0:
		return hops[len(hops)-1], true
	default:
		return peer, peerOK
	}
}

// fromRight returns up to limit X-Forwarded-For entries, rightmost first,
// across header lines, and whether the walk stopped at a malformed entry.
func fromRight(forwarded []string, limit int) ([]netip.Addr, bool) {
	var out []netip.Addr

	for v := len(forwarded) - 1; v >= 0; v-- {
		rest := forwarded[v]

		for len(out) < limit {
			i := strings.LastIndexByte(rest, ',')

			a, good := parseForwarded(rest[i+1:])
			if !good {
				return out, true
			}

			out = append(out, a)

			if i < 0 {
				break
			}

			rest = rest[:i]
		}
	}

	return out, false
}

func trusted(r *Resolver, a netip.Addr) bool {
	for _, p := range r.Proxies {
		if p.Contains(a) {
			return true
		}
	}

	return false
}

// parseHost reads RemoteAddr: "ip:port", "[ipv6]:port" or a bare address.
func parseHost(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}

	if a, err := netip.ParseAddr(s); err == nil {
		return normalize(a), true
	}

	return netip.Addr{}, false
}

// parseForwarded reads one X-Forwarded-For entry: an address, optionally with a
// port as some proxies add. Anything else is malformed.
func parseForwarded(entry string) (netip.Addr, bool) {
	entry = strings.TrimSpace(entry)
	if entry == "" || len(entry) > 64 {
		return netip.Addr{}, false
	}

	return parseHost(entry)
}

// normalize keys IPv4-mapped IPv6 as IPv4 and drops zones, which name an
// interface, not a client.
func normalize(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

// ClientIn reports whether the request's client address (before any IPv6
// prefix is taken) is in one of set: exemptions and the status endpoint's
// allowed clients, which grant more than a bucket. So the address must be one
// that no client can have written: the first untrusted address of the walk, or
// the trustedHops-th, was written by a trusted proxy. A chain of only trusted
// addresses (any private address by default) may have been written, left of
// any point, by a client inside the trusted ranges: its leftmost entry keys a
// bucket but vouches for nothing, so the TCP peer and every entry must be in
// set.
func ClientIn(r *Resolver, req *http.Request, set []netip.Prefix) bool {
	if len(set) == 0 {
		return false
	}

	forwarded := req.Header["X-Forwarded-For"]

	a, ok := ClientAddr(r, req.RemoteAddr, forwarded)
	if !ok || !inPrefixes(a, set) {
		return false
	}

	if r.Hops > 0 || !trusted(r, a) {
		return true
	}

	peer, _ := parseHost(req.RemoteAddr)
	if !inPrefixes(peer, set) {
		return false
	}

	hops, _ := fromRight(forwarded, maxForwardedEntries)
	for _, h := range hops {
		if !inPrefixes(h, set) {
			return false
		}
	}

	return true
}

func inPrefixes(a netip.Addr, set []netip.Prefix) bool {
	for _, prefix := range set {
		if prefix.Contains(a) {
			return true
		}
	}

	return false
}
