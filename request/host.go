package request

import (
	"net"
	"strings"
)

// MaxKeyLen bounds the hosts and body values kept as keys; a longer one is keyed by its
// digest, as long principal ids are.
const MaxKeyLen = 128

// HostKey is the bucket key of a layer keyed by host: the request's host,
// without its port, in lower case, or client when the request has none.
func HostKey(host, client string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}

	host = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(host), "."))
	if host == "" {
		return client
	}

	if len(host) > MaxKeyLen {
		return HashKey(host)
	}

	return "host:" + host
}
