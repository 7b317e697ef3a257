package examplecheck

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// The documentation tests: README's configuration reference names every key
// of CreateConfig's Config and shows its default, and every relative link of
// the Markdown pages resolves (the file, and the heading an #anchor names).

// keyName is how a field is spelt in a configuration: config/keys.go's rule
// (the leading capitals lower-cased: IPv6PrefixLength is ipv6PrefixLength).
func keyName(field string) string {
	n := 0
	for n < len(field) && field[n] >= 'A' && field[n] <= 'Z' {
		n++
	}

	return strings.ToLower(field[:n]) + field[n:]
}

// tlsType is what redis.tls takes as a map: it is an interface{} in Config,
// parsed into redisresp.TLSOptions (config/redis.go parseTLSMap).
var tlsType = reflect.TypeOf(redisresp.TLSOptions{})

// configKeys returns the path of every leaf key of t: nested structs and
// pointers to them as "a.b", slices of structs as "routes[].name", maps of
// structs as "plans.<name>.points". redis.tls is a leaf (true) and a section.
func configKeys(prefix string, t reflect.Type) []string {
	var keys []string

	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Name == "Unknown" {
			continue
		}

		path := prefix + keyName(f.Name)
		ft := f.Type

		if ft.Kind() == reflect.Ptr {
			ft = ft.Elem()
		}

		switch {
		case ft.Kind() == reflect.Struct:
			keys = append(keys, configKeys(path+".", ft)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, configKeys(path+"[].", ft.Elem())...)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, configKeys(path+".<name>.", ft.Elem())...)
		case path == "redis.tls":
			keys = append(keys, path)
			keys = append(keys, configKeys(path+".", tlsType)...)
		default:
			keys = append(keys, path)
		}
	}

	return keys
}

// referenceRow is one row of README's configuration reference: the keys of
// its first cell and the text of its default cell.
type referenceRow struct {
	keys     []string
	defaults string
}

var codeSpan = regexp.MustCompile("`([^`]*)`")

// referenceRows reads the table of README's "## Configuration reference".
func referenceRows(t *testing.T, doc string) []referenceRow {
	t.Helper()

	start := strings.Index(doc, "\n## Configuration reference\n")
	if start < 0 {
		t.Fatal("README has no ## Configuration reference")
	}

	section := doc[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}

	var rows []referenceRow

	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) < 3 || !strings.HasPrefix(line, "| `") {
			continue
		}

		row := referenceRow{defaults: strings.TrimSpace(cells[1])}
		for _, m := range codeSpan.FindAllStringSubmatch(strings.TrimPrefix(cells[0], "| "), -1) {
			row.keys = append(row.keys, m[1])
		}

		rows = append(rows, row)
	}

	if len(rows) == 0 {
		t.Fatal("README's configuration reference has no table rows")
	}

	return rows
}

// TestReadmeReferenceNamesEveryKey: every key of Config has a row of README's
// reference, and every key a row names is a key of Config.
func TestReadmeReferenceNamesEveryKey(t *testing.T) {
	want := map[string]bool{}
	for _, k := range configKeys("", reflect.TypeOf(tierlimit.Config{})) {
		want[k] = true
	}

	named := map[string]bool{}

	for _, row := range referenceRows(t, readme(t)) {
		for _, k := range row.keys {
			if !want[k] {
				t.Errorf("README's reference names %q, which is not a configuration key", k)
			}

			named[k] = true
		}
	}

	var missing []string

	for k := range want {
		if !named[k] {
			missing = append(missing, k)
		}
	}

	sort.Strings(missing)

	for _, k := range missing {
		t.Errorf("README's configuration reference has no row for %s", k)
	}
}

// TestReadmeDefaultsAreTheDefaults: a default in backticks is CreateConfig's
// value for its key (one span per key of the row, or one for all of them);
// a default in words (fixed, none, empty) stands for a zero value only, so a
// real default is always shown as it is.
func TestReadmeDefaultsAreTheDefaults(t *testing.T) {
	defaults := reflect.ValueOf(tierlimit.CreateConfig()).Elem()

	for _, row := range referenceRows(t, readme(t)) {
		spans := codeSpan.FindAllStringSubmatch(row.defaults, -1)

		for i, key := range row.keys {
			got, ok := defaultOf(defaults, key)

			switch {
			case len(spans) == 0:
				if ok && !got.IsZero() {
					t.Errorf("README's default for %s is %q in words; CreateConfig sets %v: show it in backticks", key, row.defaults, got.Interface())
				}
			case len(spans) != 1 && len(spans) != len(row.keys):
				t.Errorf("README's row for %v shows %d defaults for %d keys", row.keys, len(spans), len(row.keys))
			default:
				span := spans[0][1]
				if len(spans) > 1 {
					span = spans[i][1]
				}

				compareDefault(t, key, span, got, ok)
			}
		}
	}
}

// defaultOf returns CreateConfig's value at a key's path; false when the
// path goes through a section that has no value by default (a nil pointer or
// interface, a route, a plan).
func defaultOf(v reflect.Value, key string) (reflect.Value, bool) {
	for _, part := range strings.Split(key, ".") {
		for v.Kind() == reflect.Ptr || v.Kind() == reflect.Interface {
			if v.IsNil() {
				return reflect.Value{}, false
			}

			v = v.Elem()
		}

		if v.Kind() != reflect.Struct {
			return reflect.Value{}, false
		}

		var found bool

		for i := 0; i < v.NumField(); i++ {
			if keyName(v.Type().Field(i).Name) == strings.TrimSuffix(part, "[]") {
				v, found = v.Field(i), true
				break
			}
		}

		if !found || strings.HasSuffix(part, "[]") || v.Kind() == reflect.Map {
			return reflect.Value{}, false
		}
	}

	return v, true
}

func compareDefault(t *testing.T, key, span string, got reflect.Value, ok bool) {
	t.Helper()

	var shown interface{}
	if err := yaml.Unmarshal([]byte(span), &shown); err != nil {
		t.Errorf("README's default for %s, `%s`: %v", key, span, err)
		return
	}

	var actual interface{}

	// No value by default (a route's, a plan's key, or one under an unset
	// section): only the zero of a type may be shown.
	if !ok {
		switch normalise(shown) {
		case "false", "0", "":
			return
		}

		if l, isList := normalise(shown).([]interface{}); isList && len(l) == 0 {
			return
		}

		t.Errorf("README shows %s = `%s`; it has no default", key, span)

		return
	}

	raw, err := json.Marshal(got.Interface())
	if err != nil {
		t.Fatal(err)
	}

	if err := json.Unmarshal(raw, &actual); err != nil {
		t.Fatal(err)
	}

	if s, d := normalise(shown), normalise(actual); !reflect.DeepEqual(s, d) {
		t.Errorf("README shows %s = %v; the default is %v", key, s, d)
	}
}

// docPages are the Markdown pages whose relative links must resolve.
func docPages(t *testing.T) []string {
	t.Helper()

	root := harness.RepoRoot()

	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}

	if len(pages) == 0 {
		t.Fatal("docs/ holds no pages")
	}

	for _, name := range []string{"README.md", "CONTRIBUTING.md", "BENCHMARKS.md"} {
		pages = append(pages, filepath.Join(root, name))
	}

	return pages
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinksResolve: every relative link of README, CONTRIBUTING.md,
// BENCHMARKS.md and docs/*.md names a file that exists and, with an
// #anchor, a heading of that page.
func TestDocsLinksResolve(t *testing.T) {
	for _, page := range docPages(t) {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}

		rel, _ := filepath.Rel(harness.RepoRoot(), page)

		for _, target := range links(string(raw)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}

			if why := resolve(page, target); why != "" {
				t.Errorf("%s: link %s: %s", rel, target, why)
			}
		}
	}
}

// links returns the targets of the Markdown links outside fenced code.
func links(doc string) []string {
	var out []string

	for _, line := range prose(doc) {
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}

	return out
}

// prose returns the lines of doc outside ``` fences.
func prose(doc string) []string {
	var out []string

	fenced := false

	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}

		if !fenced {
			out = append(out, line)
		}
	}

	return out
}

// resolve says why target, linked from page, does not resolve ("" when it does).
func resolve(page, target string) string {
	file, anchor, _ := strings.Cut(target, "#")

	path := page
	if file != "" {
		path = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
	}

	if _, err := os.Stat(path); err != nil {
		return "no such file"
	}

	if anchor == "" {
		return ""
	}

	if !strings.HasSuffix(path, ".md") {
		return "an anchor into a file that is not Markdown"
	}

	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}

	if !anchors(string(raw))[anchor] {
		return "no heading with the anchor #" + anchor
	}

	return ""
}

// anchors returns the anchors GitHub gives the headings of doc: lower case,
// punctuation but - and _ dropped, spaces as -, a repeated one suffixed -1, -2...
func anchors(doc string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}

	for _, line := range prose(doc) {
		if !strings.HasPrefix(line, "#") {
			continue
		}

		text := strings.TrimSpace(strings.TrimLeft(line, "#"))

		var b strings.Builder

		for _, r := range strings.ToLower(text) {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteByte('-')
			}
		}

		slug := b.String()
		if n := seen[slug]; n > 0 {
			out[slug+"-"+strconv.Itoa(n)] = true
		} else {
			out[slug] = true
		}

		seen[slug]++
	}

	return out
}
