package rule

import (
	"net/http"
	"strings"

	"github.com/tierlimit/tierlimit/request"
)

// KeyFor returns the layer's bucket key for a request (Charge.Keys). A principal-keyed route
// counts requests without a principal per client IP, in a namespace of its own
// so that an IP never shares a bucket with a principal id. A header-keyed layer
// falls back to the client IP, never to a shared empty key.
func KeyFor(l *Layer, client, principal string, req *http.Request) string {
	switch l.KeyKind {
	case KeyOfClient:
		return client
	case KeyOfPrincipal:
		return principal
	case KeyOfConst:
		return l.ConstKey
	case KeyOfHeader:
		// A credential such as an API key: hashed, never kept in clear.
		if req == nil {
			return client
		}

		if v := req.Header[l.KeyHeader]; len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			return request.HashKey(strings.TrimSpace(v[0]))
		}

		return client
	case KeyOfHost:
		if req == nil {
			return client
		}

		return request.HostKey(req.Host, client)
	case KeyOfParts:
		return partsKey(l, client, principal, req)
	}

	if principal != "" {
		return principal
	}

	return "ip:" + client
}

// The key of a KeyOfParts layer whose json: source the body does not state
// (request.BodyValue), and the separator of a composite key's values.
const (
	unknownKey  = "unknown"
	partsJoiner = "|"
)

// partsKey is the key of a layer keyed by a json: source or by several
// sources: each source's value as a layer keyed by it alone would have it
// (a json: value as it is, or hashed when longer than request.MaxKeyLen),
// joined by "|", each with "%" and "|" escaped (as %25 and %7C), so that
// two different lists of values never make one key.
func partsKey(l *Layer, client, principal string, req *http.Request) string {
	if req == nil {
		return client
	}

	key := ""
	for i, part := range l.KeyParts {
		v := ""
		switch part.Kind {
		case KeyOfJSON:
			v = jsonKey(req, part.Path, l.MaxBody)
		case KeyOfClient:
			v = client
		case KeyOfHost:
			v = request.HostKey(req.Host, client)
		case KeyOfHeader:
			v = client
			if h := req.Header[part.Header]; len(h) > 0 && strings.TrimSpace(h[0]) != "" {
				v = request.HashKey(strings.TrimSpace(h[0]))
			}
		default:
			v = "ip:" + client
			if principal != "" {
				v = principal
			}
		}

		if len(l.KeyParts) == 1 {
			return v
		}

		if i > 0 {
			key += partsJoiner
		}

		key += keyEscaper.Replace(v)
	}

	return key
}

// keyEscaper escapes a value of a composite key (partsKey).
var keyEscaper = strings.NewReplacer("%", "%25", partsJoiner, "%7C")

// jsonKey is the key of a json: source: the value at path in req's body,
// hashed when longer than request.MaxKeyLen, or unknownKey when the body does
// not state one within max bytes.
func jsonKey(req *http.Request, path []string, max int64) string {
	v, ok := request.BodyValue(req, path, max)
	if !ok {
		return unknownKey
	}

	if len(v) > request.MaxKeyLen {
		return request.HashKey(v)
	}

	return v
}
