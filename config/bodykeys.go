package config

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/tierlimit/tierlimit/usage"
)

// KeyPart is one source of a route key that reads the request's body or
// combines sources (Rule.KeyParts): Key is KeyIP, KeyPrincipal, KeyHost,
// KeyHeader (Header canonical) or KeyJSON (Path, as costFrom's json: paths).
type KeyPart struct {
	Key    string
	Header string
	Path   []string
}

// The bounds of maxRequestBody: its default, and the most it takes (each
// request on the route may hold that much while its key is read).
const (
	DefaultMaxRequestBody = 8 << 20
	MaxMaxRequestBody     = 1 << 30
)

// parseKeyParts reads a key of json: sources or of several sources joined
// by commas ("header:X-Api-Key,json:model") into spec.KeyParts; field is
// the key's place, for errors.
func parseKeyParts(field, key string, spec *Rule) error {
	for i, s := range strings.Split(key, ",") {
		part, why := parseKeyPart(strings.TrimSpace(s))
		if why != "" {
			return invalid(field, key, "source "+strconv.Itoa(i+1)+" "+strconv.Quote(s)+": "+why)
		}

		spec.KeyParts = append(spec.KeyParts, part)
	}

	return nil
}

// parseKeyPart reads one source of a key of parts; why says what is wrong
// ("" when nothing).
func parseKeyPart(s string) (KeyPart, string) {
	switch {
	case s == KeyIP || s == KeyPrincipal || s == KeyHost:
		return KeyPart{Key: s}, ""
	case s == KeyGlobal:
		return KeyPart{}, "global is one bucket for everyone: it combines with nothing"
	case strings.HasPrefix(s, KeyHeader):
		name := s[len(KeyHeader):]
		if !validHeaderName(name) {
			return KeyPart{}, strconv.Quote(name) + " is not a header name"
		}

		return KeyPart{Key: KeyHeader, Header: http.CanonicalHeaderKey(name)}, ""
	case strings.HasPrefix(s, KeyJSON):
		src, err := usage.ParseSource(s)
		if err != nil {
			// ParseSource's errors read costFrom "<s>": <why>.
			why := err.Error()
			return KeyPart{}, why[strings.Index(why, ": ")+2:]
		}

		return KeyPart{Key: KeyJSON, Path: src.Path}, ""
	}

	return KeyPart{}, `must be "ip", "principal", "host", "header:<Name>" or "json:<path>"`
}

// validHeaderName reports whether name is a header name (parseKeyHeader).
func validHeaderName(name string) bool {
	_, err := parseKeyHeader(KeyHeader + name)
	return err == nil
}

// parseMaxRequestBody reads a route's maxRequestBody into spec.MaxBody: bytes,
// as an integer or with a unit (KiB, MiB, GiB, or KB, MB, GB in powers of
// ten); empty: DefaultMaxRequestBody. Only a route whose key reads the body
// takes it.
func parseMaxRequestBody(field string, rc RouteConfig, spec *Rule) error {
	raw := strings.TrimSpace(rc.MaxRequestBody)
	if !readsBody(spec.KeyParts) {
		if raw != "" {
			return invalid(field+".maxRequestBody", rc.MaxRequestBody, `is read only by a route whose key has a "json:<path>" source`)
		}

		return nil
	}

	spec.MaxBody = DefaultMaxRequestBody
	if raw == "" {
		return nil
	}

	n, ok := parseSize(raw)
	if !ok {
		return invalid(field+".maxRequestBody", rc.MaxRequestBody, `not a size in bytes (examples: 8MiB, 512KiB, 1048576)`)
	}

	if n < 1 || n > MaxMaxRequestBody {
		return invalid(field+".maxRequestBody", rc.MaxRequestBody, "must be from 1 byte to 1GiB")
	}

	spec.MaxBody = n

	return nil
}

func readsBody(parts []KeyPart) bool {
	for _, p := range parts {
		if p.Key == KeyJSON {
			return true
		}
	}

	return false
}

// sizeUnits are the units a size takes, longest first.
var sizeUnits = []struct {
	suffix string
	bytes  int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"B", 1},
}

// parseSize reads a non-negative size: an integer of bytes, or an integer
// and a unit of sizeUnits, spaces allowed between them. A negative one
// reads as such, for the caller's error.
func parseSize(raw string) (int64, bool) {
	unit := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(raw, u.suffix) {
			raw = strings.TrimSpace(strings.TrimSuffix(raw, u.suffix))
			unit = u.bytes
			break
		}
	}

	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n > MaxMaxRequestBody*2/unit {
		// Too large to hold: larger than the bound anyway.
		if err == nil {
			return MaxMaxRequestBody + 1, true
		}

		return 0, false
	}

	return n * unit, true
}
