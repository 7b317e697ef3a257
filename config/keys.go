package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
)

// Traefik decodes the plugin's configuration with mapstructure, which skips
// keys that match no field. Every configuration struct has an Unknown field
// tagged ",remain" that collects those keys, so that a typo (`ipp:`, `point:`)
// is an error rather than a silent default.

// unknownField is the name of those fields.
const unknownField = "Unknown"

// checkUnknown returns an error naming the first key, in key order at each
// level, that no field of cfg took, at any depth.
func checkUnknown(cfg *Config) error {
	return unknownIn("", reflect.ValueOf(cfg).Elem())
}

func unknownIn(path string, v reflect.Value) error {
	t := v.Type()

	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		fv := v.Field(i)

		switch {
		case f.Name == unknownField:
			if fv.Len() == 0 {
				continue
			}

			keys := make([]string, 0, fv.Len())
			for _, k := range fv.MapKeys() {
				keys = append(keys, fmt.Sprint(k.Interface()))
			}

			sort.Strings(keys)

			return fmt.Errorf("%w: unknown field %q%s", ErrConfig, path+keys[0], suggestField(path, keys[0], t))
		case f.Type.Kind() == reflect.Struct:
			if err := unknownIn(path+keyName(f.Name)+".", fv); err != nil {
				return err
			}
		case f.Type.Kind() == reflect.Ptr && f.Type.Elem().Kind() == reflect.Struct:
			if !fv.IsNil() {
				if err := unknownIn(path+keyName(f.Name)+".", fv.Elem()); err != nil {
					return err
				}
			}
		case f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.Struct:
			for j := 0; j < fv.Len(); j++ {
				if err := unknownIn(path+keyName(f.Name)+"["+strconv.Itoa(j)+"].", fv.Index(j)); err != nil {
					return err
				}
			}
		case f.Type.Kind() == reflect.Map && f.Type.Elem().Kind() == reflect.Struct:
			if err := unknownInMap(path+keyName(f.Name)+".", fv); err != nil {
				return err
			}
		}
	}

	return nil
}

// unknownInMap is unknownIn for each value of a map of sections named by
// the user (plans), in key order.
func unknownInMap(path string, m reflect.Value) error {
	keys := make([]string, 0, m.Len())
	for _, k := range m.MapKeys() {
		keys = append(keys, k.String())
	}

	sort.Strings(keys)

	for _, k := range keys {
		if err := unknownIn(path+k+".", m.MapIndex(reflect.ValueOf(k))); err != nil {
			return err
		}
	}

	return nil
}

// keyName is the key a user writes for a field, as README spells it: the
// leading capitals lowered (IP -> ip, IPv6PrefixLength -> ipv6PrefixLength,
// DryRun -> dryRun). Keys match field names case-insensitively anyway.
func keyName(field string) string {
	n := 0
	for n < len(field) && field[n] >= 'A' && field[n] <= 'Z' {
		n++
	}

	return strings.ToLower(field[:n]) + field[n:]
}

// suggestField returns ` (did you mean "<path><key>"?)` for the field of t
// closest to key, or "" when none is close.
func suggestField(path, key string, t reflect.Type) string {
	best := ""
	bestDist := 0
	lower := strings.ToLower(key)

	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Name
		if name == unknownField {
			continue
		}

		d := editDistance(lower, strings.ToLower(name))
		if len(lower) >= 3 && strings.HasPrefix(strings.ToLower(name), lower) {
			d = 1 // a key cut short
		}

		// Two assignments, not one: Yaegi stores only the call of `a, b = f(), v`
		// (e2e/yaegirules_test.go).
		if best == "" || d < bestDist {
			best = keyName(name)
			bestDist = d
		}
	}

	// A typo, not another word: at most two edits, or a third of the name.
	if best == "" || bestDist > 2 && bestDist*3 > len(best) {
		return ""
	}

	return ` (did you mean "` + path + best + `"?)`
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)

	for j := range prev {
		prev[j] = j
	}

	for i := 1; i <= len(a); i++ {
		cur[0] = i

		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}

			cur[j] = smallest(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}

		prev, cur = cur, prev
	}

	return prev[len(b)]
}

func smallest(a, b, c int) int {
	if b < a {
		a = b
	}

	if c < a {
		a = c
	}

	return a
}
