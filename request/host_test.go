package request

import (
	"strings"
	"testing"
)

func TestHostKey(t *testing.T) {
	long := strings.Repeat("a", 200) + ".example"

	for _, tc := range []struct{ host, want string }{
		{"Example.COM:8443", "host:example.com"},
		{"example.com.", "host:example.com"},
		{"[2001:db8::1]:80", "host:2001:db8::1"},
		{"", "203.0.113.5"},
		{":80", "203.0.113.5"},
		{long, HashKey(long)},
	} {
		if got := HostKey(tc.host, "203.0.113.5"); got != tc.want {
			t.Errorf("HostKey(%q) = %q, want %q", tc.host, got, tc.want)
		}
	}
}
