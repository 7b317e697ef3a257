package usage

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"runtime"
	"strings"
	"testing"
)

func TestAnExpressionIsParsedIntoWeightedTerms(t *testing.T) {
	for _, c := range []struct {
		spec    string
		weights []int64
		specs   []string
	}{
		{"llm:input + 4*llm:output", []int64{1000, 4000}, []string{"llm:input", "llm:output"}},
		{"llm:input+0.5*llm:cachedInput", []int64{1000, 500}, []string{"llm:input", "llm:cachedInput"}},
		{" 0.125 * json:usage.total_tokens ", []int64{125}, []string{"json:usage.total_tokens"}},
		{"0*header:X-Usage + 1000000*llm:total", []int64{0, 1000000000}, []string{"header:X-Usage", "llm:total"}},
		{"1.0*json:a.b", []int64{1000}, []string{"json:a.b"}},
	} {
		e, err := ParseExpr(c.spec)
		if err != nil {
			t.Fatalf("ParseExpr(%q): %v", c.spec, err)
		}

		if len(e.Terms) != len(c.weights) {
			t.Fatalf("ParseExpr(%q): %d terms, want %d", c.spec, len(e.Terms), len(c.weights))
		}

		for i, term := range e.Terms {
			if term.Weight != c.weights[i] || term.Source.Spec != c.specs[i] {
				t.Errorf("ParseExpr(%q) term %d: %d*%s, want %d*%s", c.spec, i, term.Weight, term.Source.Spec, c.weights[i], c.specs[i])
			}
		}
	}
}

func TestABadExpressionNamesItsTerm(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"llm:input + llm:inptu", `costFrom "llm:inptu": unknown source: llm:input, llm:output, llm:cachedInput or llm:total`},
		{"llm:input + ", `costFrom "": an empty term`},
		{"0.1234*llm:output", `costFrom "0.1234*llm:output": the weight "0.1234" is not`},
		{"-1*llm:output", `the weight "-1"`},
		{"1e3*llm:output", `the weight "1e3"`},
		{".5*llm:output", `the weight ".5"`},
		{"1000001*llm:output", `the weight "1000001"`},
		{"2*3*llm:output", `costFrom "2*3*llm:output": unknown source`},
		{"2*json:a*b", `costFrom "2*json:a*b": a term holds at most one "*"`},
		{"body:usage", `costFrom "body:usage": unknown source`},
		{"json:a..b + llm:input", `costFrom "json:a..b": path segment 2 is empty`},
		{strings.Repeat("llm:input+", 16) + "llm:input", "more than 16 terms"},
	} {
		_, err := ParseExpr(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseExpr(%q) = %v, want an error holding %q", c.spec, err, c.want)
		}
	}
}

// readAll reads body, in chunks of size (0: whole), with e and the header h.
func readAll(t *testing.T, spec string, h http.Header, body []byte, size int) (int64, bool) {
	t.Helper()

	e, err := ParseExpr(spec)
	if err != nil {
		t.Fatal(err)
	}

	r := Open(&e, h)
	for size > 0 && len(body) > size {
		Feed(r, body[:size])
		body = body[size:]
	}
	Feed(r, body)

	return Result(r)
}

func gzipped(b []byte) []byte {
	var out bytes.Buffer
	z := gzip.NewWriter(&out)
	_, _ = z.Write(b)
	_ = z.Close()

	return out.Bytes()
}

// The usage of each API's stream, plain and gzip-compressed, in chunks of
// every size: the last event stating each field counts.
func TestEachAPIsStreamStatesItsUsage(t *testing.T) {
	const spec = "llm:input + 4*llm:output + 0.5*llm:cachedInput"

	for _, c := range []struct {
		name, body string
		want       int64
	}{
		{"OpenAI Chat Completions, include_usage", "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n" +
			"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":10,\"prompt_tokens_details\":{\"cached_tokens\":30}}}\n\ndata: [DONE]\n\n", 155},
		{"OpenAI Responses", "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":30},\"output_tokens\":10}}}\n\n", 155},
		{"Anthropic Messages", "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":60,\"cache_read_input_tokens\":30,\"cache_creation_input_tokens\":10,\"output_tokens\":1}}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":4}}\n\n" +
			"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":10}}\n\n", 155},
		{"Gemini, alt=sse", "data: {\"usageMetadata\":{\"promptTokenCount\":100,\"candidatesTokenCount\":2}}\r\n\r\n" +
			"data: {\"usageMetadata\":{\"promptTokenCount\":100,\"candidatesTokenCount\":6,\"thoughtsTokenCount\":4,\"cachedContentTokenCount\":30}}\r\n\r\n", 155},
		{"no usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", -1},
	} {
		for _, coding := range []string{"", "gzip"} {
			body := []byte(c.body)
			h := http.Header{"Content-Type": {"text/event-stream"}}
			if coding != "" {
				body = gzipped(body)
				h["Content-Encoding"] = []string{coding}
			}

			for _, size := range []int{0, 1, 5, 64} {
				cost, ok := readAll(t, spec, h, body, size)
				if c.want < 0 && ok || c.want >= 0 && (!ok || cost != c.want) {
					t.Errorf("%s in %q, chunks of %d: %d, %v, want %d", c.name, coding, size, cost, ok, c.want)
				}
			}
		}
	}
}

// A gzip bomb in an event stream (2 KiB that decode to 64 MiB in one
// event) is skipped like any event past MaxEventBytes, the events after it
// read, and decoding it costs the memory of the bounds, not of the body.
func TestAGzipBombInAStreamCostsBoundedMemory(t *testing.T) {
	var body bytes.Buffer
	z := gzip.NewWriter(&body)
	_, _ = z.Write([]byte("data: {\"usage\":{\"total_tokens\":7},\"pad\":\""))
	pad := bytes.Repeat([]byte("a"), 1<<20)
	for i := 0; i < 64; i++ {
		_, _ = z.Write(pad)
	}
	_, _ = z.Write([]byte("\"}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n"))
	_ = z.Close()

	h := http.Header{"Content-Type": {"text/event-stream"}, "Content-Encoding": {"gzip"}}

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	cost, ok := readAll(t, "json:usage.total_tokens", h, body.Bytes(), 4096)

	runtime.ReadMemStats(&after)

	if !ok || cost != 9 {
		t.Errorf("the stream states %d, %v, want 9 from the event after the bomb", cost, ok)
	}

	if grew := after.TotalAlloc - before.TotalAlloc; grew > 4<<20 {
		t.Errorf("reading it allocated %d KiB, want at most 4 MiB", grew>>10)
	}
}

func TestAcceptEncodingIsNarrowedToTheCodingsReaders(t *testing.T) {
	for _, c := range []struct {
		in   []string
		want []string
	}{
		{nil, nil},
		{[]string{"gzip"}, []string{"gzip"}},
		{[]string{"gzip, deflate, br, zstd"}, []string{"gzip, deflate"}},
		{[]string{"br", "GZIP;q=0.5"}, []string{"GZIP;q=0.5"}},
		{[]string{"br, zstd"}, []string{"identity"}},
		{[]string{"*"}, []string{"identity"}},
		{[]string{"x-gzip , identity;q=0"}, []string{"x-gzip , identity;q=0"}},
	} {
		h := http.Header{}
		if c.in != nil {
			h["Accept-Encoding"] = append([]string(nil), c.in...)
		}

		NarrowAcceptEncoding(h)

		if got := h["Accept-Encoding"]; strings.Join(got, "|") != strings.Join(c.want, "|") || (got == nil) != (c.want == nil) {
			t.Errorf("Accept-Encoding %q narrowed to %q, want %q", c.in, got, c.want)
		}
	}
}
