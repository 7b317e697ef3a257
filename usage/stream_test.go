package usage

import (
	"strings"
	"testing"
)

// A chat completion stream as OpenAI sends it with
// stream_options.include_usage: every chunk has "usage": null but the last
// one before [DONE], whose choices are empty.
const openAIStream = `data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{"content":" wörld \"total_tokens\": 7"},"logprobs":null,"finish_reason":null}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}

data: {"id":"chatcmpl-123","object":"chat.completion.chunk","created":1694268190,"model":"gpt-4o-mini","system_fingerprint":"fp_44709d6fcb","choices":[],"usage":{"prompt_tokens":9,"completion_tokens":391,"total_tokens":400,"completion_tokens_details":{"reasoning_tokens":0}}}

data: [DONE]

`

func TestEventStream(t *testing.T) {
	const spec = "json:usage.total_tokens"

	big := `data: {"usage":{"total_tokens":99},"pad":"` + strings.Repeat("x", MaxEventBytes) + "\"}\n\n"

	for _, c := range []struct {
		name, spec, body string
		want             int64
		ok               bool
	}{
		{"openai", spec, openAIStream, 400, true},
		{"openai, completion tokens", "json:usage.completion_tokens", openAIStream, 391, true},
		{"openai, CRLF", spec, strings.ReplaceAll(openAIStream, "\n", "\r\n"), 400, true},
		{"openai, CR", spec, strings.ReplaceAll(openAIStream, "\n", "\r"), 400, true},
		{"openai, no usage", spec, strings.Replace(openAIStream, `"total_tokens":400`, `"total":400`, 1), 0, false},
		{"the last event counts", spec, "data: {\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{\"total_tokens\":2}}\n\n", 2, true},
		{"an invalid value changes nothing", spec, "data: {\"usage\":{\"total_tokens\":5}}\n\ndata: {\"usage\":{\"total_tokens\":-1}}\n\ndata: {\"usage\":{\"total_tokens\":null}}\n\ndata: {\"usage\":{\"total_tokens\":\"7\"}}\n\n", 5, true},
		{"no space after the colon", spec, "data:{\"usage\":{\"total_tokens\":3}}\n\n", 3, true},
		{"two spaces: one kept", spec, "data:  {\"usage\":{\"total_tokens\":3}}\n\n", 3, true},
		{"data lines joined", spec, "data: {\"usage\":\ndata: {\"total_tokens\":\ndata: 8}}\n\n", 8, true},
		{"data lines joined, CRLF", spec, "data: {\"usage\":\r\ndata: {\"total_tokens\":\r\ndata: 8}}\r\n\r\n", 8, true},
		{"data lines joined, CR", spec, "data: {\"usage\":\rdata: {\"total_tokens\":\rdata: 8}}\r\r", 8, true},
		{"data lines joined by a newline", spec, "data: {\"usage\":{\"total_tokens\":8\ndata: 1}}\n\n", 0, false},
		{"bare data line", spec, "data\ndata: {\"usage\":{\"total_tokens\":3}}\n\n", 3, true},
		{"comments", spec, ": ping\n\n:data: {\"usage\":{\"total_tokens\":9}}\n\ndata: {\"usage\":{\"total_tokens\":3}}\n: keep-alive\n\n", 3, true},
		{"other fields", spec, "event: done\nid: 7\nretry: 10\ndata: {\"usage\":{\"total_tokens\":3}}\nfoo: bar\ndatum: 1\n\n", 3, true},
		{"field names are exact", spec, "Data: {\"usage\":{\"total_tokens\":3}}\n\n data: {\"usage\":{\"total_tokens\":4}}\n\n", 0, false},
		{"no blank line at the end", spec, "data: {\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{\"total_tokens\":4}}\n", 4, true},
		{"no newline at the end", spec, "data: {\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{\"total_tokens\":4}}", 4, true},
		{"cut inside the last event", spec, "data: {\"usage\":{\"total_tokens\":1}}\n\ndata: {\"usage\":{\"total_tokens\":4}", 1, true},
		{"an event per blank line only", spec, "data: {\"usage\":{\"total_tokens\":1}}\ndata: {\"usage\":{\"total_tokens\":4}}\n\n", 0, false},
		{"oversized event skipped", spec, big, 0, false},
		{"oversized event skipped, a later one counts", spec, big + "data: {\"usage\":{\"total_tokens\":4}}\n\n", 4, true},
		{"oversized event skipped, an earlier one counts", spec, "data: {\"usage\":{\"total_tokens\":4}}\n\n" + big, 4, true},
		{"long comment", spec, ":" + strings.Repeat("x", 2*MaxEventBytes) + "\ndata: {\"usage\":{\"total_tokens\":4}}\n\n", 4, true},
		{"BOM", spec, "\xEF\xBB\xBFdata: {\"usage\":{\"total_tokens\":4}}\n\n", 4, true},
		{"BOM only at the start", spec, "\n\xEF\xBB\xBFdata: {\"usage\":{\"total_tokens\":4}}\n\n", 0, false},
		{"half a BOM", spec, "\xEF\xBBdata: {\"usage\":{\"total_tokens\":4}}\n\n", 0, false},
		{"escaped member name", spec, "data: {\"usage\":{\"total\\u005ftokens\":6}}\n\n", 6, true},
		{"escaped slash", "json:a/b", "data: {\"a\\/b\":6}\n\n", 6, true},
		{"escaped quote", "json:a\"b", "data: {\"a\\\"b\":6}\n\n", 6, true},
		{"escaped backslash", "json:a\\b", "data: {\"a\\\\b\":6}\n\n", 6, true},
		{"invalid UTF-8 decodes to U+FFFD", "json:a\uFFFD", "data: {\"a\xff\":6}\n\n", 6, true},
		{"JSON body sent as a stream", spec, chatCompletion, 0, false},
		{"empty", spec, "", 0, false},
	} {
		for _, size := range []int{0, 1, 2, 3, 5, 64, 4096} {
			got, ok := read(t, c.spec, eventStream, c.body, size)
			if got != c.want || ok != c.ok {
				t.Errorf("%s, chunks of %d: %d, %v, want %d, %v", c.name, size, got, ok, c.want, c.ok)
			}
		}
	}
}

// TestEventStreamSplits feeds streams split in two at every offset: inside
// "data:", inside "\r\n", inside a number and inside a UTF-8 sequence
// (the ö of openAIStream) included.
func TestEventStreamSplits(t *testing.T) {
	for _, body := range []string{
		openAIStream,
		strings.ReplaceAll(openAIStream, "\n", "\r\n"),
		strings.ReplaceAll(openAIStream, "\n", "\r"),
		"\xEF\xBB\xBFdata: {\"usage\":\r\ndata: {\"total_tokens\":4}}\r\n\r\n: x\r\ndata\r\n\r\n",
	} {
		want, wantOK := read(t, "json:usage.total_tokens", eventStream, body, 0)
		if !wantOK {
			t.Fatalf("no cost in %q", body)
		}

		for i := 0; i <= len(body); i++ {
			got, ok := readSplit(t, "json:usage.total_tokens", eventStream, body, i)
			if got != want || ok != wantOK {
				t.Errorf("split at %d (%q | %q): %d, %v, want %d, %v", i, tail(body[:i]), head(body[i:]), got, ok, want, wantOK)
			}
		}
	}
}

func TestJSONBodySplits(t *testing.T) {
	for i := 0; i <= len(chatCompletion); i++ {
		if got, ok := readSplit(t, "json:usage.total_tokens", "application/json", chatCompletion, i); !ok || got != 400 {
			t.Errorf("split at %d: %d, %v, want 400, true", i, got, ok)
		}
	}
}

func head(s string) string {
	if len(s) > 10 {
		return s[:10]
	}

	return s
}

func tail(s string) string {
	if len(s) > 10 {
		return s[len(s)-10:]
	}

	return s
}
