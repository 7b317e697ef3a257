package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/request"
)

// Validation: the error every check returns, and the checks of values that
// parsing does not turn into something else.

// ErrConfig is the sentinel every validation error wraps, so callers can tell
// a configuration error from anything else with errors.Is.
var ErrConfig = errors.New("invalid configuration")

func invalid(field string, value interface{}, why string) error {
	return fmt.Errorf("%w: %s = %q: %s", ErrConfig, field, fmt.Sprint(value), why)
}

// checkPath tells why a configured route path or asset prefix is not one:
// "" when it is.
func checkPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "?# \t\r\n") {
		return `must start with "/" and hold no query, fragment or whitespace`
	}

	return ""
}

func checkPrincipal(pc PrincipalConfig) error {
	if pc.UserHeader != "" && !request.ValidToken(pc.UserHeader) {
		return invalid("principal.userHeader", pc.UserHeader, "not a header name")
	}

	if pc.ServiceAccountHeader != "" && !request.ValidToken(pc.ServiceAccountHeader) {
		return invalid("principal.serviceAccountHeader", pc.ServiceAccountHeader, "not a header name")
	}

	for i, h := range pc.CredentialHeaders {
		if !request.ValidToken(h) {
			return invalid("principal.credentialHeaders["+strconv.Itoa(i)+"]", h, "not a header name")
		}
	}

	for i, c := range pc.CredentialCookies {
		if !request.ValidToken(c) {
			return invalid("principal.credentialCookies["+strconv.Itoa(i)+"]", c, "not a cookie name")
		}
	}

	for i, q := range pc.CredentialQueryParams {
		if q == "" {
			return invalid("principal.credentialQueryParams["+strconv.Itoa(i)+"]", q, "must not be empty")
		}
	}

	for i, code := range pc.InvalidCredentialStatus {
		if code < 100 || code > 599 {
			return invalid("principal.invalidCredentialStatus["+strconv.Itoa(i)+"]", code, "not an HTTP status")
		}
	}

	return nil
}

func sameStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}

	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}

	return true
}

// validName limits layer names to characters that are safe unquoted in Redis
// keys, log lines and structured header fields.
func validName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}

	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}

	return true
}

// checkMaxTracked rejects a cap below the number of layers that are on: one
// request charges a counter in each of its layers (global, its tier or plan,
// the routes it matches), and a store that cannot hold one counter per layer for
// one key would evict the counters of a request's own layers, letting every
// request through.
func checkMaxTracked(s *Settings) error {
	if !s.Enabled {
		return nil
	}

	var on []string

	for _, l := range Rules(s) {
		if l.On() {
			on = append(on, l.Name)
		}
	}

	if s.MaxTracked >= len(on) {
		return nil
	}

	return invalid("maxTracked", s.MaxTracked, "must be at least "+strconv.Itoa(len(on))+
		", one counter for each layer that is on ("+strings.Join(on, ", ")+")")
}
