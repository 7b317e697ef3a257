package request

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
)

// MaxPrincipalLen bounds the principal ids kept as keys (and exempted); a longer id (an auth
// server that puts a token in the header) is keyed by its digest, so a header
// cannot make the store hold large keys.
const MaxPrincipalLen = 128

// Principal is what an instance reads to tell who sent a request: the
// headers the auth server sets after ForwardAuth, or, at an edge, where the
// client's credentials may be. Header names are canonical. Fixed once built.
type Principal struct {
	UserHeader        string   // "" when principal tiers are off
	ServiceHeader     string   // the service-account flag
	CredentialHeaders []string // empty after ForwardAuth (UserHeader set)
	CredentialCookies []string
	CredentialParams  []string // query parameters
}

// PrincipalOf returns the principal id that the auth server set in
// userHeader (Principal.UserHeader), or "" when principal tiers are off or
// the header is absent. Only an instance placed after ForwardAuth may set
// userHeader: before it, the client controls the header. It takes the one
// setting it reads, not the Principal, so that the caller's frame pays for
// no more than one field (doc.go: frames).
func PrincipalOf(userHeader string, req *http.Request) string {
	if userHeader == "" {
		return ""
	}

	// The header map is read directly: userHeader is canonical.
	v := req.Header[userHeader]
	if len(v) == 0 {
		return ""
	}

	id := strings.TrimSpace(v[0])
	if len(id) > MaxPrincipalLen {
		return HashKey(id)
	}

	return id
}

// IsServiceAccount reads the auth server's service-account flag from
// serviceHeader (Principal.ServiceHeader): "true" or "1".
func IsServiceAccount(serviceHeader string, req *http.Request) bool {
	if serviceHeader == "" {
		return false
	}

	h := req.Header[serviceHeader]
	if len(h) == 0 {
		return false
	}

	v := strings.TrimSpace(h[0])

	return v == "1" || strings.EqualFold(v, "true")
}

// HasCredentialElsewhere reports whether the request carries a non-empty
// credential in one of pr's cookies or query parameters (the root's
// hasCredential reads the headers first).
func HasCredentialElsewhere(pr *Principal, req *http.Request) bool {
	for _, name := range pr.CredentialCookies {
		if c, err := req.Cookie(name); err == nil && c.Value != "" {
			return true
		}
	}

	if len(pr.CredentialParams) > 0 && req.URL.RawQuery != "" {
		q := req.URL.Query()
		for _, name := range pr.CredentialParams {
			if q.Get(name) != "" {
				return true
			}
		}
	}

	return false
}

// HashKey returns a short, stable digest of a key that must not be kept or
// shown in clear (a credential, or an overlong id).
func HashKey(s string) string {
	sum := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(sum[:16])
}
