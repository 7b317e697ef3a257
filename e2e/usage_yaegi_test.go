package e2e

import (
	"strconv"
	"strings"
	"testing"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/usage"
)

// TestUsageUnderYaegi runs the usage package in Yaegi, on bodies in chunks
// of several sizes, and compares every answer with the compiled package's:
// the parsers and the Reader use encoding/json, strconv and byte-at-a-time
// state that compiled tests alone would not prove Yaegi runs the same.
func TestUsageUnderYaegi(t *testing.T) {
	gp := t.TempDir()
	if err := harness.CopyPlugin(gp); err != nil {
		t.Fatal(err)
	}

	i := interp.New(interp.Options{GoPath: gp})
	if err := i.Use(stdlib.Symbols); err != nil {
		t.Fatal(err)
	}

	for _, src := range []string{
		`import ("strconv"; "github.com/tierlimit/tierlimit/usage")`,
		`func read(spec, contentType, body string, size int) string {
			src, err := usage.ParseSource(spec)
			if err != nil {
				return err.Error()
			}
			r := usage.NewReader(src, contentType)
			for size > 0 && len(body) > size {
				usage.Feed(r, []byte(body[:size]))
				body = body[size:]
			}
			usage.Feed(r, []byte(body))
			cost, ok := usage.Result(r)
			return strconv.FormatInt(cost, 10) + " " + strconv.FormatBool(ok)
		}`,
		`func header(v string) string {
			cost, ok := usage.ParseHeaderValue(v)
			return strconv.FormatInt(cost, 10) + " " + strconv.FormatBool(ok)
		}`,
	} {
		if _, err := i.Eval(src); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
	}

	stream := "\xEF\xBB\xBF: hi\r\n" +
		"data: {\"choices\":[{\"delta\":{\"content\":\"h\u00e9\"}}],\"usage\":null}\r\n\r\n" +
		"event: x\ndata: {\"usage\":\ndata:{\"total_tokens\":4.0e2}}\n\n" +
		"data: {\"usage\":{\"total_tokens\":-1}}\r\r" +
		"data: " + strings.Repeat("z", usage.MaxEventBytes) + "\n\n" +
		"data: [DONE]\n"
	jsonBody := `{"id":"x","usage":{"prompt_tokens":9,"total_tokens":400}}`

	cases := []struct{ spec, contentType, body string }{
		{"json:usage.total_tokens", "text/event-stream; charset=utf-8", stream},
		{"json:usage.total_tokens", "text/event-stream", strings.TrimSuffix(stream, "data: [DONE]\n") + "data: {\"usage\":{\"total_tokens\":7}}"},
		{"json:usage.prompt_tokens", "text/event-stream", stream},
		{"json:usage.total_tokens", "application/json", jsonBody},
		{"json:usage.prompt_tokens", "application/json", jsonBody},
		{"json:usage.missing", "application/json", jsonBody},
		{"json:usage.total_tokens", "application/json", `{"usage":{"total_tokens":"400"}}`},
		{"json:usage.total_tokens", "application/json", `{"pad":"` + strings.Repeat("p", usage.MaxJSONBody) + `"}`},
		{"json:a..b", "application/json", jsonBody},
		{"header:x-tokens", "application/json", jsonBody},
	}

	for _, c := range cases {
		for _, size := range []int{0, 1, 3, 4096} {
			call := "read(" + strconv.Quote(c.spec) + ", " + strconv.Quote(c.contentType) + ", " + strconv.Quote(c.body) + ", " + strconv.Itoa(size) + ")"

			v, err := i.Eval(call)
			if err != nil {
				t.Fatalf("%s, chunks of %d, under Yaegi: %v", c.spec, size, err)
			}

			if got, want := v.String(), compiledRead(c.spec, c.contentType, c.body, size); got != want {
				t.Errorf("%s on %.40q..., chunks of %d: Yaegi says %q, compiled %q", c.spec, c.body, size, got, want)
			}
		}
	}

	for _, h := range []string{"400", " 4.00E+2 ", "0400", "400.5", "-0", "1e18", "999999999999999999", "x"} {
		v, err := i.Eval("header(" + strconv.Quote(h) + ")")
		if err != nil {
			t.Fatalf("header(%q) under Yaegi: %v", h, err)
		}

		cost, ok := usage.ParseHeaderValue(h)
		if got, want := v.String(), strconv.FormatInt(cost, 10)+" "+strconv.FormatBool(ok); got != want {
			t.Errorf("ParseHeaderValue(%q): Yaegi says %q, compiled %q", h, got, want)
		}
	}
}

// compiledRead is the interpreted read, compiled.
func compiledRead(spec, contentType, body string, size int) string {
	src, err := usage.ParseSource(spec)
	if err != nil {
		return err.Error()
	}

	r := usage.NewReader(src, contentType)

	for size > 0 && len(body) > size {
		usage.Feed(r, []byte(body[:size]))
		body = body[size:]
	}

	usage.Feed(r, []byte(body))

	cost, ok := usage.Result(r)

	return strconv.FormatInt(cost, 10) + " " + strconv.FormatBool(ok)
}
