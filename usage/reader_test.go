package usage

import (
	"strings"
	"testing"
)

// read feeds body to a new Reader of spec in chunks of size bytes (the whole
// body at once when size is 0) and returns its result.
func read(t *testing.T, spec, contentType, body string, size int) (int64, bool) {
	t.Helper()

	src, err := ParseSource(spec)
	if err != nil {
		t.Fatal(err)
	}

	r := NewReader(src, contentType)

	if size == 0 {
		Feed(r, []byte(body))
	}

	for size > 0 && body != "" {
		n := size
		if n > len(body) {
			n = len(body)
		}

		Feed(r, []byte(body[:n]))
		body = body[n:]
	}

	return Result(r)
}

// readSplit feeds body in two chunks, split at i.
func readSplit(t *testing.T, spec, contentType, body string, i int) (int64, bool) {
	t.Helper()

	src, err := ParseSource(spec)
	if err != nil {
		t.Fatal(err)
	}

	r := NewReader(src, contentType)
	Feed(r, []byte(body[:i]))
	Feed(r, []byte(body[i:]))

	return Result(r)
}

// A chat completion as OpenAI returns it.
const chatCompletion = `{
  "id": "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  "object": "chat.completion",
  "created": 1741570283,
  "model": "gpt-4o-2024-08-06",
  "choices": [
    {
      "index": 0,
      "message": {
        "role": "assistant",
        "content": "The image shows a wooden boardwalk \"usage\": {\"total_tokens\": 7}",
        "refusal": null,
        "annotations": []
      },
      "logprobs": null,
      "finish_reason": "stop"
    }
  ],
  "usage": {
    "prompt_tokens": 1117,
    "completion_tokens": 46,
    "total_tokens": 400,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}
  },
  "service_tier": "default",
  "system_fingerprint": "fp_fc9f1d7035"
}
`

func TestJSONBody(t *testing.T) {
	for _, c := range []struct {
		name, spec, body string
		want             int64
		ok               bool
	}{
		{"openai", "json:usage.total_tokens", chatCompletion, 400, true},
		{"openai prompt", "json:usage.prompt_tokens", chatCompletion, 1117, true},
		{"nested", "json:usage.completion_tokens_details.reasoning_tokens", chatCompletion, 0, true},
		{"top level", "json:tokens", `{"tokens": 12}`, 12, true},
		{"deep", "json:a.b.c.d.e.f.g.h", `{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":5}}}}}}}}`, 5, true},
		{"integral float", "json:n", `{"n": 400.0}`, 400, true},
		{"exponent", "json:n", `{"n": 4e2}`, 400, true},
		{"duplicate member: the last", "json:n", `{"n": 1, "n": 2}`, 2, true},
		{"escaped member name", "json:usage.total_tokens", `{"usage":{"total\u005ftokens":9}}`, 9, true},
		{"big", "json:n", `{"n": 999999999999999999}`, 999999999999999999, true},
		{"no float64 rounding", "json:n", `{"n": 123456789012345678}`, 123456789012345678, true},
		{"missing", "json:usage.total_tokens", `{"usage": {"prompt_tokens": 3}}`, 0, false},
		{"missing parent", "json:usage.total_tokens", `{"id": "x"}`, 0, false},
		{"null", "json:usage.total_tokens", `{"usage": {"total_tokens": null}}`, 0, false},
		{"null parent", "json:usage.total_tokens", `{"usage": null}`, 0, false},
		{"parent not an object", "json:usage.total_tokens", `{"usage": [1, 2]}`, 0, false},
		{"parent a number", "json:usage.total_tokens", `{"usage": 400}`, 0, false},
		{"negative", "json:n", `{"n": -400}`, 0, false},
		{"minus zero", "json:n", `{"n": -0}`, 0, false},
		{"fraction", "json:n", `{"n": 400.5}`, 0, false},
		{"string", "json:n", `{"n": "400"}`, 0, false},
		{"bool", "json:n", `{"n": true}`, 0, false},
		{"object", "json:n", `{"n": {"total": 4}}`, 0, false},
		{"too big", "json:n", `{"n": 1000000000000000000}`, 0, false},
		{"beyond int64", "json:n", `{"n": 18446744073709551616}`, 0, false},
		{"case differs", "json:Usage.total_tokens", `{"usage": {"total_tokens": 4}}`, 0, false},
		{"not an object", "json:n", `[{"n": 4}]`, 0, false},
		{"truncated", "json:n", `{"n": 4, "m": `, 0, false},
		{"trailing garbage", "json:n", `{"n": 4} x`, 0, false},
		{"two values", "json:n", `{"n": 4} {"n": 5}`, 0, false},
		{"empty", "json:n", ``, 0, false},
		{"not json", "json:n", `n=4`, 0, false},
	} {
		for _, size := range []int{0, 1, 7, 4096} {
			got, ok := read(t, c.spec, "application/json", c.body, size)
			if got != c.want || ok != c.ok {
				t.Errorf("%s, chunks of %d: %d, %v, want %d, %v", c.name, size, got, ok, c.want, c.ok)
			}
		}
	}
}

func TestJSONBodyBound(t *testing.T) {
	usage := `,"usage":{"total_tokens":400}}`
	pad := func(n int) string { // a body of exactly n bytes
		return `{"pad":"` + strings.Repeat("x", n-len(usage)-len(`{"pad":"`)-1) + `"` + usage
	}

	for _, c := range []struct {
		n  int
		ok bool
	}{
		{MaxJSONBody, true},
		{MaxJSONBody + 1, false},
		{4 * MaxJSONBody, false},
	} {
		body := pad(c.n)
		if len(body) != c.n {
			t.Fatalf("pad(%d) is %d bytes", c.n, len(body))
		}

		for _, size := range []int{0, 4096, 1000} {
			if got, ok := read(t, "json:usage.total_tokens", "application/json", body, size); ok != c.ok || (ok && got != 400) {
				t.Errorf("a body of %d bytes in chunks of %d: %d, %v, want ok %v", c.n, size, got, ok, c.ok)
			}
		}
	}
}

func TestContentTypes(t *testing.T) {
	stream := "data: {\"usage\":{\"total_tokens\":3}}\n\n"

	for _, c := range []struct {
		contentType string
		ok          bool // read as events
	}{
		{"text/event-stream", true},
		{"text/event-stream; charset=utf-8", true},
		{"Text/Event-Stream;charset=UTF-8", true},
		{" text/event-stream ", true},
		{"application/json", false},
		{"", false},
		{"text/event-streams", false},
		{"text/plain", false},
	} {
		got, ok := read(t, "json:usage.total_tokens", c.contentType, stream, 0)
		if ok != c.ok || (ok && got != 3) {
			t.Errorf("Content-Type %q: %d, %v, want ok %v", c.contentType, got, ok, c.ok)
		}
	}

	// And a JSON body whatever its content type, other than an event stream.
	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "text/plain", ""} {
		if got, ok := read(t, "json:usage.total_tokens", ct, chatCompletion, 0); !ok || got != 400 {
			t.Errorf("Content-Type %q, a JSON body: %d, %v, want 400, true", ct, got, ok)
		}
	}
}

func TestHeaderSourceReadsNoBody(t *testing.T) {
	if got, ok := read(t, "header:X-Tokens", "application/json", `{"X-Tokens": 4}`, 0); ok {
		t.Errorf("a header source read %d from the body", got)
	}

	if got, ok := Result(&Reader{}); ok {
		t.Errorf("the zero Reader read %d", got)
	}
}

func TestResultEnds(t *testing.T) {
	src, _ := ParseSource("json:n")
	r := NewReader(src, "application/json")
	Feed(r, []byte(`{"n": 4}`))

	if got, ok := Result(r); !ok || got != 4 {
		t.Fatalf("Result = %d, %v, want 4, true", got, ok)
	}

	Feed(r, []byte(` garbage`))

	if got, ok := Result(r); !ok || got != 4 {
		t.Errorf("Result after a Feed after Result = %d, %v, want 4, true", got, ok)
	}

	if r.buf != nil {
		t.Errorf("Result kept a buffer of %d bytes", cap(r.buf))
	}
}
