package config

import (
	"reflect"
	"strings"
	"testing"
)

func bodyRoute(key, maxBody string) *Config {
	c := Defaults()
	c.Routes = []RouteConfig{{Name: "llm", Paths: []string{"/v1/"}, Points: 10, Duration: "60s", Key: key, MaxRequestBody: maxBody}}

	return c
}

// Keys of the body and of several sources parse into their parts, and
// maxRequestBody into bytes (8 MiB by default).
func TestBodyAndCompositeKeysParse(t *testing.T) {
	cases := []struct {
		key, maxBody string
		parts        []KeyPart
		bytes        int64
	}{
		{"json:model", "", []KeyPart{{Key: KeyJSON, Path: []string{"model"}}}, 8 << 20},
		{"header:x-api-key,json:model", "", []KeyPart{{Key: KeyHeader, Header: "X-Api-Key"}, {Key: KeyJSON, Path: []string{"model"}}}, 8 << 20},
		{"ip, json:metadata.user_id", "512KiB", []KeyPart{{Key: KeyIP}, {Key: KeyJSON, Path: []string{"metadata", "user_id"}}}, 512 << 10},
		{"principal,host", "", []KeyPart{{Key: KeyPrincipal}, {Key: KeyHost}}, 0},
		{"json:model", "1048576", []KeyPart{{Key: KeyJSON, Path: []string{"model"}}}, 1 << 20},
		{"json:model", "2 MB", []KeyPart{{Key: KeyJSON, Path: []string{"model"}}}, 2000000},
		{"json:model", "1GiB", []KeyPart{{Key: KeyJSON, Path: []string{"model"}}}, 1 << 30},
	}

	for _, c := range cases {
		s, err := Parse(bodyRoute(c.key, c.maxBody))
		if err != nil {
			t.Errorf("key %q, maxRequestBody %q: %v", c.key, c.maxBody, err)
			continue
		}

		r := s.Routes[0]
		if r.Key != KeyParts || !reflect.DeepEqual(r.KeyParts, c.parts) || r.MaxBody != c.bytes {
			t.Errorf("key %q, maxRequestBody %q: %s %+v, %d bytes; want %+v, %d", c.key, c.maxBody, r.Key, r.KeyParts, r.MaxBody, c.parts, c.bytes)
		}
	}
}

// A bad key or maxRequestBody is an error that names the field, the value
// and what is wrong.
func TestBodyKeyErrorsNameTheFieldAndTheValue(t *testing.T) {
	cases := []struct {
		key, maxBody, field, value, why string
	}{
		{"json:", "", "routes[0].key", "json:", "source 1 \"json:\": an empty path"},
		{"header:X-Api-Key,json:", "", "routes[0].key", "header:X-Api-Key,json:", "source 2 \"json:\": an empty path"},
		{"json:a..b", "", "routes[0].key", "json:a..b", "path segment 2 is empty"},
		{"json:choices.0", "", "routes[0].key", "json:choices.0", "array indexes are not supported"},
		{"header:X-Api-Key,cookie:sid", "", "routes[0].key", "header:X-Api-Key,cookie:sid", `source 2 "cookie:sid": must be`},
		{"ip,global", "", "routes[0].key", "ip,global", "combines with nothing"},
		{"json:model,", "", "routes[0].key", "json:model,", `source 2 "": must be`},
		{"header:X Api,json:model", "", "routes[0].key", "header:X Api,json:model", "is not a header name"},
		{"json:model", "-1", "routes[0].maxRequestBody", "-1", "from 1 byte to 1GiB"},
		{"json:model", "0", "routes[0].maxRequestBody", "0", "from 1 byte to 1GiB"},
		{"json:model", "2GiB", "routes[0].maxRequestBody", "2GiB", "from 1 byte to 1GiB"},
		{"json:model", "99999999999999999999", "routes[0].maxRequestBody", "99999999999999999999", "not a size"},
		{"json:model", "eight MiB", "routes[0].maxRequestBody", "eight MiB", "not a size"},
		{"json:model", "8mb", "routes[0].maxRequestBody", "8mb", "not a size"},
		{"header:X-Api-Key", "8MiB", "routes[0].maxRequestBody", "8MiB", `whose key has a "json:<path>" source`},
	}

	for _, c := range cases {
		_, err := Parse(bodyRoute(c.key, c.maxBody))
		if err == nil {
			t.Errorf("key %q, maxRequestBody %q accepted", c.key, c.maxBody)
			continue
		}

		if want := c.field + ` = "` + c.value + `"`; !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("key %q, maxRequestBody %q: %v; want %s and %q", c.key, c.maxBody, err, want, c.why)
		}
	}
}
