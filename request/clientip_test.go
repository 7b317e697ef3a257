package request

import (
	"net/http"
	"net/netip"
	"strconv"
	"testing"
)

// defaultProxies is the root's default trustedProxies (config.go), parsed.
var defaultProxies = []netip.Prefix{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("fc00::/7"),
}

// TestKeyCacheIsPerPeerAndBounded: the cached key of a line depends on the
// peer host (a line from an untrusted peer is not read), never on its port,
// and the cache holds at most maxCachedKeys entries.
func TestKeyCacheIsPerPeerAndBounded(t *testing.T) {
	r := &Resolver{Proxies: defaultProxies, IPv6Prefix: 64, Cache: NewKeyCache()}

	key := func(remote, xff string) string {
		req := &http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {xff}}}
		return Resolve(r, req)
	}

	if got := key("10.0.0.2:80", "198.51.100.1"); got != "198.51.100.1" {
		t.Fatalf("trusted peer: %q", got)
	}

	if got := key("203.0.113.9:80", "198.51.100.1"); got != "203.0.113.9" {
		t.Fatalf("untrusted peer after a trusted one with the same line: %q", got)
	}

	if got := key("10.0.0.2:81", "198.51.100.1"); got != "198.51.100.1" || cachedKeys(r.Cache) != 2 {
		t.Fatalf("another port of the trusted peer: %q, %d entries", got, cachedKeys(r.Cache))
	}

	// A second line, the proxy's, is read: the entry of the first line
	// alone is not its key.
	two := &http.Request{RemoteAddr: "10.0.0.2:80", Header: http.Header{"X-Forwarded-For": {"198.51.100.1", "203.0.113.44"}}}
	if got := Resolve(r, two); got != "203.0.113.44" || cachedKeys(r.Cache) != 2 {
		t.Fatalf("two lines, the first one cached alone: %q, %d entries", got, cachedKeys(r.Cache))
	}

	for i := 0; i < 3*maxCachedKeys; i++ {
		want := "198.51." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256)
		if got := key("10.0.0.2:80", want); got != want || cachedKeys(r.Cache) > maxCachedKeys {
			t.Fatalf("entry %d: key %q, %d entries", i, got, cachedKeys(r.Cache))
		}
	}
}

// cachedKeys is the number of entries c holds.
func cachedKeys(c *KeyCache) int {
	n := 0
	c.keys.Range(func(_, _ interface{}) bool {
		n++
		return true
	})

	return n
}
