package tierlimit

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// maxPrincipalLen bounds the principal ids kept as keys; a longer id (an auth
// server that puts a token in the header) is keyed by its digest, so a header
// cannot make the store hold large keys.
const maxPrincipalLen = 128

// principalOf returns the principal id that the auth server set in
// principal.userHeader, or "" when principal tiers are off or the header is
// absent. Only an instance placed after ForwardAuth may set userHeader: before
// it, the client controls the header.
func principalOf(p *Plugin, req *http.Request) string {
	if p.userHeader == "" {
		return ""
	}

	// The header map is read directly: userHeader is canonical.
	v := req.Header[p.userHeader]
	if len(v) == 0 {
		return ""
	}

	id := strings.TrimSpace(v[0])
	if len(id) > maxPrincipalLen {
		return hashKey(id)
	}

	return id
}

// isServiceAccount reads the auth server's service-account flag: "true" or "1".
func isServiceAccount(p *Plugin, req *http.Request) bool {
	if p.serviceHeader == "" {
		return false
	}

	h := req.Header[p.serviceHeader]
	if len(h) == 0 {
		return false
	}

	v := strings.TrimSpace(h[0])

	return v == "1" || strings.EqualFold(v, "true")
}

// hasCredentialElsewhere is hasCredential for cookies and query parameters.
func hasCredentialElsewhere(p *Plugin, req *http.Request) bool {
	for _, name := range p.credCookies {
		if c, err := req.Cookie(name); err == nil && c.Value != "" {
			return true
		}
	}

	if len(p.credQuery) > 0 && req.URL.RawQuery != "" {
		q := req.URL.Query()
		for _, name := range p.credQuery {
			if q.Get(name) != "" {
				return true
			}
		}
	}

	return false
}

// hashKey returns a short, stable digest of a key that must not be kept or
// shown in clear (a credential, or an overlong id).
func hashKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:16])
}
