package e2e

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/traefik/yaegi/interp"
	"github.com/traefik/yaegi/stdlib"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/usage"
)

// TestUsageExpressionsUnderYaegi runs costFrom expressions (llm: variables,
// weighted sums) on bodies plain, gzip- and deflate-compressed, in Yaegi,
// and compares every answer with the compiled package's: a compressed body
// is decoded by a goroutine that the interpreted Reader feeds over channels,
// through compress/gzip, compress/zlib and compress/flate (Yaegi's stdlib
// symbols), which calls the interpreted Read back.
func TestUsageExpressionsUnderYaegi(t *testing.T) {
	gp := t.TempDir()
	if err := harness.CopyPlugin(gp); err != nil {
		t.Fatal(err)
	}

	i := interp.New(interp.Options{GoPath: gp})
	if err := i.Use(stdlib.Symbols); err != nil {
		t.Fatal(err)
	}

	for _, src := range []string{
		`import ("net/http"; "strconv"; "github.com/tierlimit/tierlimit/usage")`,
		`func readExpr(spec, contentType, coding, body string, size int) string {
			e, err := usage.ParseExpr(spec)
			if err != nil {
				return err.Error()
			}
			h := http.Header{"Content-Type": {contentType}, "X-Extra": {"3"}}
			if coding != "" {
				h["Content-Encoding"] = []string{coding}
			}
			r := usage.Open(&e, h)
			for size > 0 && len(body) > size {
				usage.Feed(r, []byte(body[:size]))
				body = body[size:]
			}
			usage.Feed(r, []byte(body))
			cost, ok := usage.Result(r)
			return strconv.FormatInt(cost, 10) + " " + strconv.FormatBool(ok)
		}`,
	} {
		if _, err := i.Eval(src); err != nil {
			t.Fatalf("%s: %v", src, err)
		}
	}

	anthropic := "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":100,\"cache_read_input_tokens\":50,\"output_tokens\":1}}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}}\n\n"
	responses := "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":20},\"output_tokens\":30}}}\n\n"
	gemini := "data: {\"usageMetadata\":{\"promptTokenCount\":100,\"candidatesTokenCount\":3}}\r\n\r\n" +
		"data: {\"usageMetadata\":{\"promptTokenCount\":100,\"candidatesTokenCount\":20,\"thoughtsTokenCount\":10,\"cachedContentTokenCount\":40}}\r\n\r\n"
	chat := `{"usage":{"prompt_tokens":100,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":20}}}`
	bomb := `{"usage":{"total_tokens":4},"pad":"` + strings.Repeat("a", 4*usage.MaxJSONBody) + `"}`

	sse := "text/event-stream"
	cases := []struct{ spec, contentType, body string }{
		{"llm:input + 4*llm:output", sse, anthropic},
		{"llm:input + 0.5*llm:cachedInput + 2.125*llm:output", sse, responses},
		{"llm:total + llm:cachedInput", sse, gemini},
		{"llm:input + 4*llm:output + 0.001*llm:cachedInput", "application/json", chat},
		{"json:usage.prompt_tokens + 2*header:X-Extra", "application/json", chat},
		{"json:usage.total_tokens", "application/json", chat},
		{"json:usage.total_tokens", "application/json", bomb},
	}

	for _, c := range cases {
		for _, coding := range []string{"", "gzip", "deflate", "br"} {
			body := encode(t, coding, c.body)
			for _, size := range []int{0, 7, 4096} {
				call := "readExpr(" + strconv.Quote(c.spec) + ", " + strconv.Quote(c.contentType) + ", " + strconv.Quote(coding) + ", " + strconv.Quote(body) + ", " + strconv.Itoa(size) + ")"

				v, err := i.Eval(call)
				if err != nil {
					t.Fatalf("%s in %q, chunks of %d, under Yaegi: %v", c.spec, coding, size, err)
				}

				if got, want := v.String(), compiledReadExpr(c.spec, c.contentType, coding, body, size); got != want {
					t.Errorf("%s in %q on %.40q..., chunks of %d: Yaegi says %q, compiled %q", c.spec, coding, c.body, size, got, want)
				}
			}
		}
	}
}

// encode is body in coding ("": as it is; br: as it is, which no reader
// decodes).
func encode(t *testing.T, coding, body string) string {
	t.Helper()

	var b bytes.Buffer

	switch coding {
	case "gzip":
		z := gzip.NewWriter(&b)
		_, _ = z.Write([]byte(body))
		_ = z.Close()
	case "deflate":
		z := zlib.NewWriter(&b)
		_, _ = z.Write([]byte(body))
		_ = z.Close()
	default:
		return body
	}

	return b.String()
}

// compiledReadExpr is the interpreted readExpr, compiled.
func compiledReadExpr(spec, contentType, coding, body string, size int) string {
	e, err := usage.ParseExpr(spec)
	if err != nil {
		return err.Error()
	}

	h := http.Header{"Content-Type": {contentType}, "X-Extra": {"3"}}
	if coding != "" {
		h["Content-Encoding"] = []string{coding}
	}

	r := usage.Open(&e, h)

	for size > 0 && len(body) > size {
		usage.Feed(r, []byte(body[:size]))
		body = body[size:]
	}

	usage.Feed(r, []byte(body))

	cost, ok := usage.Result(r)

	return strconv.FormatInt(cost, 10) + " " + strconv.FormatBool(ok)
}
