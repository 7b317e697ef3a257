package tierlimit

import (
	"net/http"
	"testing"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/request"
)

func resolverFor(t *testing.T, proxies []string, hops, v6 int) *request.Resolver {
	t.Helper()

	r := &request.Resolver{Hops: hops, IPv6Prefix: v6, Cache: request.NewKeyCache()}

	for _, raw := range proxies {
		p, err := config.ParsePrefix(raw)
		if err != nil {
			t.Fatalf("prefix %q: %v", raw, err)
		}

		r.Proxies = append(r.Proxies, p)
	}

	return r
}

func TestClientKey(t *testing.T) {
	cases := []struct {
		name    string
		proxies []string // nil: the defaults
		hops    int
		v6      int
		remote  string
		xff     []string
		want    string
	}{
		{name: "plain peer", remote: "203.0.113.9:5555", want: "203.0.113.9"},
		{name: "untrusted peer cannot pick its bucket", remote: "203.0.113.9:5555", xff: []string{"198.51.100.1"}, want: "203.0.113.9"},
		{name: "untrusted peer, many entries", remote: "203.0.113.9:5555", xff: []string{"1.1.1.1, 2.2.2.2", "3.3.3.3"}, want: "203.0.113.9"},
		{name: "trusted peer, one hop", remote: "10.0.0.2:80", xff: []string{"198.51.100.1"}, want: "198.51.100.1"},
		{name: "trusted chain skips trusted hops", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, 192.168.1.1, 10.0.0.7"}, want: "198.51.100.1"},
		{name: "client spoofs left of the real client", remote: "10.0.0.2:80", xff: []string{"6.6.6.6, 198.51.100.1, 10.0.0.7"}, want: "198.51.100.1"},
		{name: "multiple header lines are one list", remote: "10.0.0.2:80", xff: []string{"6.6.6.6, 198.51.100.1", "10.0.0.7"}, want: "198.51.100.1"},
		{name: "all trusted: the leftmost", remote: "127.0.0.1:80", xff: []string{"10.1.1.1, 192.168.0.5"}, want: "10.1.1.1"},
		{name: "trusted peer, no header", remote: "127.0.0.1:80", want: "127.0.0.1"},
		{name: "malformed rightmost: the peer", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, garbage"}, want: "10.0.0.2"},
		{name: "malformed after trusted: last good", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, not-an-ip, 10.0.0.9"}, want: "10.0.0.9"},
		{name: "empty entry is malformed", remote: "10.0.0.2:80", xff: []string{"198.51.100.1, , 10.0.0.9"}, want: "10.0.0.9"},
		{name: "empty header value", remote: "10.0.0.2:80", xff: []string{""}, want: "10.0.0.2"},
		{name: "entry with port", remote: "10.0.0.2:80", xff: []string{"198.51.100.1:4444"}, want: "198.51.100.1"},
		{name: "bracketed ipv6 entry with port", remote: "10.0.0.2:80", xff: []string{"[2001:db8:1:2::5]:4444"}, want: "2001:db8:1:2::/64"},
		{name: "overlong chain stops at the bound", remote: "10.0.0.2:80", xff: []string{"198.51.100.1" + repeat(", 10.0.0.1", 40)}, want: "10.0.0.1"},
		{name: "ipv6 grouped by /64", remote: "[2001:db8:aa:bb:1:2:3:4]:443", want: "2001:db8:aa:bb::/64"},
		{name: "ipv6 same /64 same key", remote: "[2001:db8:aa:bb:ffff::1]:443", want: "2001:db8:aa:bb::/64"},
		{name: "ipv6 /48", v6: 48, remote: "[2001:db8:aa:bb::1]:443", want: "2001:db8:aa::/48"},
		{name: "ipv6 /128 keeps the address", v6: 128, remote: "[2001:db8::1]:443", want: "2001:db8::1"},
		{name: "ipv6 zone dropped", remote: "[fe80::1%eth0]:443", want: "fe80::/64"},
		{name: "ipv4-mapped peer keyed as ipv4", remote: "[::ffff:203.0.113.9]:80", want: "203.0.113.9"},
		{name: "ipv4-mapped peer is trusted as ipv4", remote: "[::ffff:10.0.0.2]:80", xff: []string{"198.51.100.1"}, want: "198.51.100.1"},
		{name: "ipv4-mapped entry keyed as ipv4", remote: "10.0.0.2:80", xff: []string{"::ffff:198.51.100.1"}, want: "198.51.100.1"},
		{name: "trusted ipv6 proxy", remote: "[fd00::1]:80", xff: []string{"2001:db8::1"}, want: "2001:db8::/64"},
		{name: "custom proxies: loopback untrusted", proxies: []string{"10.0.0.0/8"}, remote: "127.0.0.1:80", xff: []string{"198.51.100.1"}, want: "127.0.0.1"},
		{name: "no proxies: nothing trusted", proxies: []string{}, remote: "10.0.0.2:80", xff: []string{"198.51.100.1"}, want: "10.0.0.2"},
		{name: "unparsable peer never empty", remote: "@", want: request.UnknownClient},
		{name: "empty peer never empty", remote: "", xff: []string{"198.51.100.1"}, want: request.UnknownClient},
		{name: "bare address peer", remote: "203.0.113.9", want: "203.0.113.9"},
		{name: "hops 1: rightmost", hops: 1, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, 198.51.100.1"}, want: "198.51.100.1"},
		{name: "hops 2: second from right", hops: 2, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, 198.51.100.1, 10.0.0.7"}, want: "198.51.100.1"},
		{name: "hops across header lines", hops: 2, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, 198.51.100.1", "10.0.0.7"}, want: "198.51.100.1"},
		{name: "hops: fewer entries gives the peer", hops: 3, remote: "203.0.113.9:1", xff: []string{"198.51.100.1, 10.0.0.7"}, want: "203.0.113.9"},
		{name: "hops: no header gives the peer", hops: 1, remote: "203.0.113.9:1", want: "203.0.113.9"},
		{name: "hops: malformed before the nth ends at last good", hops: 3, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, bad, 10.0.0.7"}, want: "10.0.0.7"},
		{name: "hops: malformed rightmost gives the peer", hops: 1, remote: "203.0.113.9:1", xff: []string{"6.6.6.6, bad"}, want: "203.0.113.9"},
	}

	for _, tc := range cases {
		proxies := tc.proxies
		if proxies == nil && tc.hops == 0 {
			proxies = CreateConfig().TrustedProxies
		}

		v6 := tc.v6
		if v6 == 0 {
			v6 = 64
		}

		r := resolverFor(t, proxies, tc.hops, v6)
		req := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}

		for _, v := range tc.xff {
			req.Header.Add("X-Forwarded-For", v)
		}

		if got := clientKey(r, req); got != tc.want {
			t.Errorf("%s: key %q, want %q", tc.name, got, tc.want)
		}

		// The same with the cache, missed then hit.
		r.Cache = request.NewKeyCache()
		for pass := 0; pass < 2; pass++ {
			if got := clientKey(r, req); got != tc.want {
				t.Errorf("%s, cached (pass %d): key %q, want %q", tc.name, pass, got, tc.want)
			}
		}
	}
}

func repeat(s string, n int) string {
	out := ""
	for i := 0; i < n; i++ {
		out += s
	}

	return out
}
