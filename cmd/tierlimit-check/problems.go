package main

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/traefik/traefik/v3/pkg/plugins"
)

// Every error of a middleware: Traefik decodes the configuration (all its
// wrong types at once, in Go's field names: 'Routes[0].Points') and then New
// stops at the first error it finds. So the check reports each decoding
// error in the configuration's names (routes[0].points, as New's errors and
// README say them), then builds again without what it reported, until the
// middleware builds or what is left cannot be told apart from what was
// reported:
//   - a wrong type or an unknown key is taken out, and the check goes on;
//   - any other error is the first of its section (a route, a plan, a
//     route's plan, a built-in layer, redis, status, exempt, response,
//     websocket, or a top-level setting): the section is taken out (a route
//     is replaced by one that is off, so that the others keep their
//     indices), since its other checks read the fields that error is about;
//     for the same reason, such an error in a section that lost a wrong
//     type is not reported (the section is taken out all the same);
//   - an error of store or principal, which other sections are checked
//     against, is the last one reported.

// maxProblems bounds the builds of one middleware.
const maxProblems = 100

// problems is every error the check finds in middleware m, in the order
// found; none when it builds.
func (c *check) problems(b *plugins.Builder, m middleware) []string {
	conf, _ := clone(m.config).(map[string]any)
	seen := map[string]bool{}
	tainted := map[string]bool{} // sections that lost a wrong type

	var out []string

	for len(out) < maxProblems {
		ctor, err := b.Build(m.alias, conf, m.name)
		if err == nil {
			err = c.construct(ctor)
		}

		if err == nil {
			return out
		}

		if decoded := decodeErrors(err.Error()); decoded != nil {
			var ok bool
			if out, ok = takeOutDecoded(conf, decoded, out, tainted); !ok {
				return out
			}

			continue
		}

		msg := oneLine(err)
		field, value, unknown := failedField(msg)

		switch {
		case seen[msg]:
			return out
		case field == "":
			return append(out, msg)
		case unknown || !tainted[sectionOf(field)]:
			out = append(out, msg)
		}

		seen[msg] = true

		if !(unknown && remove(conf, field)) && !takeOut(conf, field, value) {
			return out
		}
	}

	return append(out, "(more errors not shown)")
}

// takeOutDecoded adds the decoding errors to out and takes their fields out
// of conf, marking their sections tainted; false when the check must stop
// (nothing was taken out, or a field other sections are checked against).
func takeOutDecoded(conf map[string]any, decoded []decodeError, out []string, tainted map[string]bool) ([]string, bool) {
	progress, stop := false, false

	for _, d := range decoded {
		path := configPath(conf, d.goPath)
		out = append(out, "failed to decode configuration: "+d.message(conf, path))

		section := sectionOf(path)
		tainted[section] = true
		stop = stop || section == "store" || section == "principal"
		progress = remove(conf, path) || takeOut(conf, path, "") || progress
	}

	return out, progress && !stop
}

// sectionOf is the section of a field (see above), in lower case.
func sectionOf(field string) string {
	segs := splitPath(strings.ToLower(field))

	switch {
	case segs[0].key == "routes" && len(segs) >= 4 && segs[2].key == "plans":
		return "routes[" + strconv.Itoa(segs[1].index) + "].plans." + segs[3].key
	case segs[0].key == "routes" && len(segs) >= 2:
		return "routes[" + strconv.Itoa(segs[1].index) + "]"
	case segs[0].key == "plans" && len(segs) >= 2:
		return "plans." + segs[1].key
	}

	return segs[0].key
}

// errorField reads the field New's error names: `invalid configuration:
// unknown field "F"`, or `invalid configuration: F = "value": why`.
var errorField = regexp.MustCompile(`invalid configuration: (?:unknown field "([^"]+)"|([^ ]+) = "((?:[^"\\]|\\.)*)")`)

// failedField is the field of New's error msg, its value, and whether the
// field is an unknown key; "" when msg names none.
func failedField(msg string) (string, string, bool) {
	sub := errorField.FindStringSubmatch(msg)
	switch {
	case sub == nil:
		return "", "", false
	case sub[1] != "":
		return sub[1], "", true
	}

	value, err := strconv.Unquote(`"` + sub[3] + `"`)
	if err != nil {
		value = sub[3]
	}

	return sub[2], value, false
}

// takeOut takes the section of field out of conf (see above); false when
// it does not (the field is one other sections are checked against, or
// conf does not hold it).
func takeOut(conf map[string]any, field, value string) bool {
	segs := splitPath(field)
	top := strings.ToLower(segs[0].key)

	switch top {
	case "store", "principal":
		return false
	case "trustedhops", "trustedproxies":
		a := remove(conf, "trustedHops")
		return remove(conf, "trustedProxies") || a
	case "routes":
		return takeOutRoute(conf, segs, value)
	case "plans":
		if len(segs) == 1 {
			return remove(conf, "plans."+value)
		}

		return removeSegs(conf, segs[:2])
	}

	return removeSegs(conf, segs[:1])
}

// takeOutRoute takes out the route plan of segs (routes[i].plans.<name>),
// or else replaces route i with one that is off.
func takeOutRoute(conf map[string]any, segs []seg, value string) bool {
	if len(segs) < 2 || segs[1].key != "" {
		return false
	}

	if len(segs) >= 3 && strings.EqualFold(segs[2].key, "plans") {
		if len(segs) == 3 {
			return removeSegs(conf, append(segs[:3:3], seg{key: value}))
		}

		return removeSegs(conf, segs[:4])
	}

	routes, ok := lookup(conf, segs[:1]).([]any)
	if !ok || segs[1].index >= len(routes) {
		return false
	}

	n := strconv.Itoa(segs[1].index)
	off := map[string]any{"name": "tierlimit-check-" + n, "paths": []any{"/"}, "points": "0", "duration": "1s"}

	if fmt.Sprint(routes[segs[1].index]) == fmt.Sprint(off) {
		return false
	}

	routes[segs[1].index] = off

	return true
}

// A decoding error of mapstructure, which names the field as Go does.
type decodeError struct {
	goPath string // 'Routes[0].Points'
	text   string // the whole message
}

// decodeErrors reads Traefik's decoding error (mapstructure's list: "N
// error(s) decoding:\n\n* ...\n* ..."); nil when text is another error.
func decodeErrors(text string) []decodeError {
	_, list, ok := strings.Cut(text, "error(s) decoding:")
	if !ok || !strings.Contains(text, "failed to decode configuration") {
		return nil
	}

	var out []decodeError

	for _, line := range strings.Split(list, "\n* ")[1:] {
		line = strings.TrimSpace(line)

		start := strings.IndexByte(line, '\'')
		end := strings.IndexByte(line[start+1:], '\'')
		if start < 0 || end < 0 {
			out = append(out, decodeError{text: line})
			continue
		}

		out = append(out, decodeError{goPath: line[start+1 : start+1+end], text: line})
	}

	sort.Slice(out, func(i, j int) bool { return out[i].goPath < out[j].goPath })

	return out
}

// message is the error in the configuration's words: `routes[0].points =
// "five": not a whole number`.
func (d decodeError) message(conf map[string]any, path string) string {
	if d.goPath == "" {
		return d.text
	}

	value := fmt.Sprint(lookup(conf, splitPath(path)))

	why := strings.ReplaceAll(d.text, "'"+d.goPath+"'", path)

	switch {
	case strings.HasPrefix(d.text, "cannot parse") && strings.Contains(d.text, " as int"),
		strings.HasPrefix(d.text, "cannot parse") && strings.Contains(d.text, " as uint"):
		why = "not a whole number"
		if strings.Contains(d.text, "out of range") {
			why = "out of range"
		}
	case strings.HasPrefix(d.text, "cannot parse") && strings.Contains(d.text, " as float"):
		why = "not a number"
	case strings.HasPrefix(d.text, "cannot parse") && strings.Contains(d.text, " as bool"):
		why = "not true or false"
	case strings.Contains(d.text, "expected a map"):
		why = "must be a section of keys and values"
	case strings.Contains(d.text, "source data must be an array or slice"):
		why = "must be a list"
	case strings.Contains(d.text, "expected type"):
		if _, t, ok := strings.Cut(d.text, "expected type '"); ok {
			t, _, _ = strings.Cut(t, "'")
			why = "must be of type " + t
		}
	}

	return path + " = " + strconv.Quote(value) + ": " + why
}

// configPath is a Go field path of mapstructure's ('Routes[0].Plans[pro].Points')
// as the configuration names it (routes[0].plans.pro.points): README's keys
// (keyName), list indices, and the names of plans as conf holds them.
func configPath(conf map[string]any, goPath string) string {
	var b strings.Builder

	for i := 0; i < len(goPath); {
		switch {
		case goPath[i] == '.':
			i++
		case goPath[i] == '[':
			end := strings.IndexByte(goPath[i:], ']')
			if end < 0 {
				end = len(goPath) - i - 1
			}

			inner := goPath[i+1 : i+end]
			if _, err := strconv.Atoi(inner); err == nil {
				b.WriteString("[" + inner + "]")
			} else {
				b.WriteString("." + inner)
			}

			i += end + 1
		default:
			end := strings.IndexAny(goPath[i:], ".[")
			if end < 0 {
				end = len(goPath) - i
			}

			if b.Len() > 0 {
				b.WriteByte('.')
			}

			b.WriteString(keyName(goPath[i : i+end]))
			i += end
		}
	}

	return b.String()
}

// keyName is the key README writes for a field: its leading capitals
// lowered (IP: ip, IPv6PrefixLength: ipv6PrefixLength, DryRun: dryRun), as
// the plugin's config.keyName does.
func keyName(field string) string {
	n := 0
	for n < len(field) && field[n] >= 'A' && field[n] <= 'Z' {
		n++
	}

	return strings.ToLower(field[:n]) + field[n:]
}

// seg is a step of a field path: a key, or a list index when key is "".
type seg struct {
	key   string
	index int
}

// splitPath splits a field path as the plugin's errors write it
// (routes[0].plans.pro.points) into steps. A plan's name may hold a dot:
// lookup finds the longest key a map holds.
func splitPath(path string) []seg {
	var out []seg

	for _, part := range strings.Split(path, ".") {
		name, rest, _ := strings.Cut(part, "[")
		out = append(out, seg{key: name})

		for rest != "" {
			idx, after, _ := strings.Cut(rest, "]")
			n, _ := strconv.Atoi(idx)
			out = append(out, seg{index: n})
			_, rest, _ = strings.Cut(after, "[")
		}
	}

	return out
}

// find is the value at segs[0] in v: a map's key matched without case
// (Traefik's decoding ignores case), joined with the next steps' keys when
// the map holds such a key (a plan named "a.b"), or a list's element
// (Docker labels give lists as maps keyed "[0]"). It returns the key as v
// holds it and how many steps it took.
func find(v any, segs []seg) (any, string, int) {
	switch x := v.(type) {
	case map[string]any:
		if segs[0].key == "" {
			key := "[" + strconv.Itoa(segs[0].index) + "]"
			return x[key], key, 1
		}

		for n := len(segs); n >= 1; n-- {
			want := joinKeys(segs[:n])
			for k, e := range x {
				if want != "" && strings.EqualFold(k, want) {
					return e, k, n
				}
			}
		}
	case []any:
		if segs[0].key == "" && segs[0].index < len(x) {
			return x[segs[0].index], "", 1
		}
	}

	return nil, "", 0
}

// joinKeys is the steps' keys joined with dots; "" when one is an index.
func joinKeys(segs []seg) string {
	keys := make([]string, len(segs))
	for i, s := range segs {
		if s.key == "" {
			return ""
		}

		keys[i] = s.key
	}

	return strings.Join(keys, ".")
}

// lookup is the value at segs in conf; nil when there is none.
func lookup(conf any, segs []seg) any {
	v := conf
	for len(segs) > 0 {
		next, _, n := find(v, segs)
		if n == 0 {
			return nil
		}

		v, segs = next, segs[n:]
	}

	return v
}

// remove deletes the field at path from conf: a map's key, or a list's
// element (the list then holds one fewer); false when conf has none.
func remove(conf map[string]any, path string) bool {
	return removeSegs(conf, splitPath(path))
}

func removeSegs(conf map[string]any, segs []seg) bool {
	var parent any = conf

	for {
		v, key, n := find(parent, segs)
		if n == 0 {
			return false
		}

		if n < len(segs) {
			parent, segs = v, segs[n:]
			continue
		}

		switch x := parent.(type) {
		case map[string]any:
			delete(x, key)
			return true
		case []any:
			return false // an element of a list: takeOut replaces routes; wrong types are keys
		}

		return false
	}
}

// clone is a deep copy of a provider's configuration map.
func clone(v any) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = clone(e)
		}

		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = clone(e)
		}

		return out
	}

	return v
}
