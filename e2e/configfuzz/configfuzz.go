// Package configfuzz makes plugin configurations from fuzz input, shaped as
// Traefik's providers hand them to the plugin, and decodes them as Traefik
// does (pkg/plugins: mitchellh/mapstructure, weakly typed, with the hook
// that splits a string on ","), so that FuzzNewNeverPanics can call New with
// any configuration Traefik could give it. configdecode replays the corpus
// through Traefik's own loader (Yaegi).
package configfuzz

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"

	"github.com/mitchellh/mapstructure"

	"github.com/tierlimit/tierlimit"
)

// Decode decodes m over CreateConfig's defaults exactly as Traefik v3.6
// decodes a plugin's configuration (pkg/plugins/middlewareyaegi.go,
// createConfig).
func Decode(m map[string]any) (*tierlimit.Config, error) {
	cfg := tierlimit.CreateConfig()

	decoder, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		DecodeHook:       mapstructure.StringToSliceHookFunc(","),
		WeaklyTypedInput: true,
		Result:           cfg,
	})
	if err != nil {
		return nil, err
	}

	return cfg, decoder.Decode(m)
}

// Config is the configuration map of a fuzz input: base, a JSON object
// (anything else: an empty map), changed by the operations that ops encodes
// (apply). So a seed can be a configuration written out, and the fuzzer
// reaches every field from any start.
func Config(base, ops []byte) map[string]any {
	m := map[string]any{}
	if err := json.Unmarshal(base, &m); err != nil || m == nil {
		m = map[string]any{}
	}

	apply(m, ops)

	return m
}

// seg is one step of a field path: a map key, or a list index when key is "".
type seg struct {
	key   string
	index int
}

// Paths is every field path of the configuration's schema (Config's fields,
// recursively; the lists of sections with indices 0 to 2, the maps of
// sections with the names of planNames), sections included, so that a value
// of any kind can land anywhere.
var Paths = schemaPaths()

// planNames are the names an operation gives plans and route plans: usual
// ones, one that differs in case, a built-in layer's, one with a dot, an
// empty one and one too long.
var planNames = []string{"free", "pro", "Pro", "ip", "a.b", "", strings.Repeat("n", 70)}

func schemaPaths() [][]seg {
	var out [][]seg

	var walk func(prefix []seg, t reflect.Type)
	walk = func(prefix []seg, t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Name == "Unknown" {
				continue
			}

			p := append(append([]seg(nil), prefix...), seg{key: keyName(f.Name)})
			out = append(out, p)

			ft := f.Type
			if ft.Kind() == reflect.Ptr {
				ft = ft.Elem()
			}

			switch {
			case ft.Kind() == reflect.Struct:
				walk(p, ft)
			case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
				for j := 0; j < 3; j++ {
					q := append(append([]seg(nil), p...), seg{index: j})
					out = append(out, q)
					walk(q, ft.Elem())
				}
			case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
				for _, name := range planNames {
					q := append(append([]seg(nil), p...), seg{key: name})
					out = append(out, q)
					walk(q, ft.Elem())
				}
			}
		}
	}

	walk(nil, reflect.TypeOf(tierlimit.Config{}))

	// The TLS section's keys (an interface{} field read by the plugin).
	for _, k := range []string{"ca", "cert", "key", "serverName", "insecureSkipVerify"} {
		out = append(out, []seg{{key: "redis"}, {key: "tls"}, {key: k}})
	}

	return out
}

// keyName is a field's key as a user writes it (IPv6PrefixLength:
// ipv6PrefixLength); mapstructure matches keys case-insensitively anyway.
func keyName(field string) string {
	n := 0
	for n < len(field) && field[n] >= 'A' && field[n] <= 'Z' {
		n++
	}

	return strings.ToLower(field[:n]) + field[n:]
}

// reader hands out the operations' bytes; zeros once they run out.
type reader struct {
	b []byte
}

func (r *reader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}

	c := r.b[0]
	r.b = r.b[1:]

	return c
}

func (r *reader) bytes(n int) []byte {
	if n > len(r.b) {
		n = len(r.b)
	}

	out := r.b[:n]
	r.b = r.b[n:]

	return out
}

// apply runs the operations of ops on m: each is a path (two bytes, an
// index into Paths) and a value (value), or, for one value kind, the
// path's removal.
func apply(m map[string]any, ops []byte) {
	r := &reader{b: ops}

	for len(r.b) > 0 {
		p := Paths[int(binary.BigEndian.Uint16([]byte{r.byte(), r.byte()}))%len(Paths)]

		fill := len(r.b) > 0 && r.b[0]&0x40 != 0
		v, del := value(r, p[len(p)-1].key)
		if del {
			remove(m, p)
			continue
		}

		set(m, p, v)
		if fill {
			complete(m, p)
		}
	}
}

// complete gives the routes and plans on path p of m what they need to be
// valid, where they lack it (a name, paths, points and a duration; the
// principal's headers for a plan), so that one operation reaches what
// building a route or a plan does with a value no field of theirs is
// checked against.
func complete(m map[string]any, p []seg) {
	var cur any = m

	for i, s := range p {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[s.key]
		case []any:
			cur = c[s.index]
		default:
			return
		}

		section, ok := cur.(map[string]any)
		if !ok || i == 0 {
			continue
		}

		switch p[i-1].key {
		case "routes":
			n := strconv.Itoa(s.index)
			defaults(section, "name", "r"+n, "paths", []any{"/r" + n}, "points", "5", "duration", "1s")
		case "plans":
			defaults(section, "points", "3", "duration", "1s")
			principal, ok := m["principal"].(map[string]any)
			if !ok {
				principal = map[string]any{}
				m["principal"] = principal
			}

			defaults(principal, "userHeader", "X-Auth-User", "planHeader", "X-Auth-Plan")
		}
	}
}

// defaults sets each key of kv (key, value, key, value...) that section
// lacks.
func defaults(section map[string]any, kv ...any) {
	for i := 0; i < len(kv); i += 2 {
		k, _ := kv[i].(string)
		if _, ok := section[k]; !ok {
			section[k] = kv[i+1]
		}
	}
}

// value is a value made from r for the field named field: one of the
// values that field usually takes (pools), a number of any size, raw
// bytes, a list, a section, or the removal of the field (del). Scalars come
// as the file provider and Docker labels send them (strings, lists as
// "a,b") or as Kubernetes sends them (float64, bool).
func value(r *reader, field string) (v any, del bool) {
	kind := r.byte()

	switch kind % 10 {
	case 0, 1, 2, 3:
		return pick(r, poolOf(field)), false
	case 4:
		var b [8]byte
		copy(b[:], r.bytes(8))
		n := int64(binary.BigEndian.Uint64(b[:]))
		return number(r, n), false
	case 5:
		return pick(r, numbers), false
	case 6:
		return string(r.bytes(int(r.byte() % 24))), false
	case 7:
		pool := poolOf(field)
		list := make([]any, int(r.byte()%4))
		for i := range list {
			list[i] = pick(r, pool)
		}

		if kind&0x80 != 0 {
			parts := make([]string, len(list))
			for i, e := range list {
				parts[i] = toString(e)
			}

			return strings.Join(parts, ","), false
		}

		return list, false
	case 8:
		return map[string]any{keyName(string(r.bytes(int(r.byte() % 8)))): pick(r, numbers)}, false
	}

	return nil, true
}

// number is n as a provider may send it: a string, a float64 or an int.
func number(r *reader, n int64) any {
	switch r.byte() % 3 {
	case 0:
		return strconv.FormatInt(n, 10)
	case 1:
		return float64(n)
	}

	return int(n)
}

func pick(r *reader, pool []any) any {
	return pool[int(r.byte())%len(pool)]
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}

	b, _ := json.Marshal(v)

	return string(b)
}

var numbers = []any{
	"0", "1", "-1", "2", "5", "10", "1000", "0.5", "1.5", "1e3", "2147483648", "9007199254740993",
	"4611686018427387904", "9223372036854775807", "-9223372036854775808", "99999999999999999999",
	float64(0), float64(1), float64(-1), float64(3), float64(1 << 40), math.MaxFloat64, math.NaN(), math.Inf(1),
	true, false, "true", "", " ",
}

var (
	durations = []any{"1s", "60s", "500ms", "1ms", "0.5ms", "0", "0s", "-1s", "1", "1.5", "1.500000", "60",
		"31536000", "31536001", "8760h", "8761h", "1h", "24h", "soon", "", "1e3s", "9223372036854775807", float64(2), "100ns"}
	pools = map[string][]any{
		"points": {"0", "1", "2", "3", "5", "10", "50", "1000", "1000000", "-1", float64(0), float64(1),
			"9007199254740992", "2147483647", "4611686018427387904", "9223372036854775807"},
		"burst":         {"0", "1", "2", "5", "100", "-1", "1000000000000", "9007199254740992"},
		"cost":          {"0", "1", "2", "3", "5", "-1", "1000", "9223372036854775807"},
		"reserve":       {"0", "1", "2", "3", "5", "-1", "1000", "9223372036854775807"},
		"duration":      durations,
		"blockDuration": durations,
		"dialTimeout":   durations,
		"timeout":       durations,
		"syncInterval":  durations,
		"algorithm":     {"fixed", "sliding", "tokenbucket", "concurrency", "", " sliding", "leaky"},
		"calendar":      {"day", "week", "month", "year", "", "Day"},
		"utcOffset":     {"+07:00", "-03:30", "+00:00", "+14:00", "-12:00", "+14:01", "-12:30", "Z", "+7", "", "+07:60"},
		"store":         {"memory", "redis", "", "memcached", "Redis"},
		"key": {"ip", "principal", "global", "host", "header:X-Api-Key", "header:", "header:bad name", "json:model",
			"X-Api-Key", ""},
		"costFrom": {"header:X-Usage", "json:usage.total_tokens", "json:", "json:a..b", "header:", "llm:total",
			"usage.total_tokens", "", "llm:input + 4*llm:output", "0.5*llm:cachedInput+llm:input", "llm:inptu",
			"1.2345*llm:output", "llm:input +", "2*3*llm:total", "1000001*header:X-Usage", "0*json:usage.x + header:X"},
		"name":                    {"chat", "login", "chat.pro", "global", "ip", "websocket", "a.b", "", "bad name", strings.Repeat("r", 64), strings.Repeat("r", 65)},
		"paths":                   {"/a", "/a/", "/", "a", "/a?b", "/A", "/%2e%2e/a", "/a;b", "//a", "/a b"},
		"pathPrefixes":            {"/assets/", "/", "/static", "assets", "/a#b"},
		"methods":                 {"GET", "post", "POST", "BAD METHOD", "", "*"},
		"countStatus":             {"200", "401", "429", "99", "600", "0", float64(500)},
		"invalidCredentialStatus": {"401", "403", "99", "600"},
		"statusCode":              {"429", "503", "200", "0", "-1"},
		"trustedProxies":          {"10.0.0.0/8", "::1", "127.0.0.1/8", "::ffff:10.0.0.0/104", "bad", "1.2.3.4/33", ""},
		"ips":                     {"10.0.0.0/8", "::1", "bad", "0.0.0.0/0"},
		"allowedIPs":              {"127.0.0.1/32", "::1/128", "bad"},
		"principals":              {"ann", "", " ", strings.Repeat("p", 129)},
		"trustedHops":             {"0", "1", "2", "-1", "1000"},
		"ipv6PrefixLength":        {"64", "0", "1", "128", "129", "-1"},
		"maxTracked":              {"1", "2", "3", "5", "100000", "0", "-1"},
		"maxConnectionsPerIP":     {"0", "1", "-1", "1000000"},
		"userHeader":              {"X-Auth-User", "", "bad header", "X-Auth-Plan", "X-Auth-Service-Account"},
		"planHeader":              {"X-Auth-Plan", "", "bad header", "X-Auth-User"},
		"serviceAccountHeader":    {"X-Auth-Service-Account", "", "X-Auth-User", "bad header"},
		"credentialHeaders":       {"Authorization", "Cookie", "bad header", ""},
		"credentialCookies":       {"session", "bad cookie", ""},
		"credentialQueryParams":   {"access_token", ""},
		"path":                    {"/_rl", "/_rl/", "_rl", "/", "/a?b", ""},
		"body":                    {"{limit} {remaining} {reset} {resetUnix} {retryAfter} {layer}", "{unknown}", "{", "}", "", "plain"},
		"contentType":             {"application/json", "text/plain", "", "a\r\nb"},
		"keyPrefix":               {"ratelimit", "", "a b", "rl:{x}"},
		"address":                 {"127.0.0.1:6379", "", "localhost", ":0", "bad:port:x"},
		"addresses":               {"127.0.0.1:26379", "127.0.0.1:7000", "", "bad"},
		"masterName":              {"mymaster", ""},
		"poolSize":                {"16", "0", "1", "-1", "100000"},
		"db":                      {"0", "1", "15", "16", "-1"},
		"tls":                     {"true", "false", true, map[string]any{"insecureSkipVerify": "true"}, map[string]any{"ca": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----"}, "yes", map[string]any{"cert": "c.pem"}},
		"ca":                      {"/nonexistent/ca.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----", ""},
		"cert":                    {"/nonexistent/cert.pem", ""},
		"serverName":              {"redis.local", ""},
	}
	bools = []any{"true", "false", true, false, "1", "0", "maybe", ""}
)

// poolOf is the usual values of a field by its name (numbers or booleans
// for names it does not know).
func poolOf(field string) []any {
	if pool, ok := pools[field]; ok {
		return pool
	}

	switch field {
	case "enabled", "dryRun", "headers", "caseSensitive", "global", "insecureSkipVerify":
		return bools
	}

	return numbers
}

// set puts v at path p of m, making the sections and lists on the way (and
// replacing a value of another kind that stands where one is needed).
func set(m map[string]any, p []seg, v any) {
	var cur any = m

	for i, s := range p {
		last := i == len(p)-1

		var next any
		if !last {
			if p[i+1].key == "" {
				next = []any{}
			} else {
				next = map[string]any{}
			}
		}

		switch c := cur.(type) {
		case map[string]any:
			if last {
				c[s.key] = v
				return
			}

			if !sameKind(c[s.key], next) {
				c[s.key] = next
			}

			cur = c[s.key]
			if l, ok := cur.([]any); ok && p[i+1].key == "" {
				cur = grow(c, s.key, l, p[i+1].index)
			}
		case []any:
			if last {
				c[s.index] = v
				return
			}

			if !sameKind(c[s.index], next) {
				c[s.index] = next
			}

			cur = c[s.index]
		}
	}
}

// grow makes the list at m[key] hold index, with empty sections, and
// returns it.
func grow(m map[string]any, key string, l []any, index int) []any {
	for len(l) <= index {
		l = append(l, map[string]any{})
	}

	m[key] = l

	return l
}

func sameKind(have, want any) bool {
	switch want.(type) {
	case []any:
		_, ok := have.([]any)
		return ok
	case map[string]any:
		_, ok := have.(map[string]any)
		return ok
	}

	return false
}

// remove deletes the value at path p of m, if there is one (a list's
// element is emptied, so that the other indices keep their place).
func remove(m map[string]any, p []seg) {
	var cur any = m

	for i, s := range p {
		last := i == len(p)-1

		switch c := cur.(type) {
		case map[string]any:
			if last {
				delete(c, s.key)
				return
			}

			cur = c[s.key]
		case []any:
			if s.index >= len(c) {
				return
			}

			if last {
				c[s.index] = map[string]any{}
				return
			}

			cur = c[s.index]
		default:
			return
		}
	}
}
