package sdk

import (
	"context"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/e2e/sdk/fakellm"
)

// The tests of this file are LLM gateways in the real Traefik, called by the
// official OpenAI and Anthropic Go SDKs as their users call them (over
// HTTP/2, as they reach a gateway over TLS: env's h2c client), against a
// backend that answers as those APIs do (fakellm): gzip-compressed, since
// Go's HTTP client accepts gzip, and in each API's JSON and event formats.

const sdkDynamic = `
http:
  routers:
    llm:
      entryPoints: [web]
      rule: PathPrefix(` + "`/v1/`" + `)
      middlewares: [llm]
      service: llm
  middlewares:
    llm:
      plugin:
        tierlimit:
          global: {points: 0}
          ip: {points: 0}
          status: {path: /v1/_ratelimit}
          routes:
{{routes}}
  services:
    llm:
      loadBalancer:
        servers:
          - url: "{{llm}}"
`

// said is what the fake API answers.
const said = "Hello from the fake API."

// startSDK runs Traefik with the routes (YAML list items, indented as
// sdkDynamic's) in front of a fake LLM API whose answers state u.
func startSDK(t *testing.T, u fakellm.Usage, routes string) (*env, *fakellm.Server) {
	t.Helper()

	llm := fakellm.New(u)

	url, stop, err := harness.Serve("127.0.0.1:0", llm)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)

	e := start(t, strings.NewReplacer("{{routes}}", routes, "{{llm}}", url).Replace(sdkDynamic))
	e.waitRouters("llm")

	return e, llm
}

func sdkContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)

	return ctx
}

func openaiClient(e *env, key string, opts ...option.RequestOption) *openai.Client {
	c := openai.NewClient(append([]option.RequestOption{option.WithAPIKey(key), option.WithBaseURL(e.traefik.Web + "/v1/"), option.WithHTTPClient(e.client)}, opts...)...)
	return &c
}

func anthropicClient(e *env, key string, opts ...aoption.RequestOption) *anthropic.Client {
	c := anthropic.NewClient(append([]aoption.RequestOption{aoption.WithAPIKey(key), aoption.WithBaseURL(e.traefik.Web), aoption.WithHTTPClient(e.client)}, opts...)...)
	return &c
}

func chatParams(content string) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{Model: "gpt-5-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(content)}}
}

func messageParams() anthropic.MessageNewParams {
	return anthropic.MessageNewParams{Model: "claude-haiku-4-5", MaxTokens: 1024,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}
}

// statusOf is the SDK error's HTTP status (0: none).
func statusOf(err error) int {
	var oe *openai.Error
	if errors.As(err, &oe) {
		return oe.StatusCode
	}

	var ae *anthropic.Error
	if errors.As(err, &ae) {
		return ae.StatusCode
	}

	return 0
}

// checkGzipped fails unless the fake API answered n calls, each gzip-compressed.
func checkGzipped(t *testing.T, llm *fakellm.Server, n int) {
	t.Helper()

	calls := llm.Calls()
	if len(calls) != n {
		t.Fatalf("the API answered %d calls, want %d: %+v", len(calls), n, calls)
	}

	for _, c := range calls {
		if !c.Gzip {
			t.Fatalf("call %+v was answered uncompressed: the gzip case is not tested", c)
		}
	}
}

// layerCounts reads the status page: the counts of layer's keys, and its refusals.
func (e *env) layerCounts(layer string) (map[string]int64, int64) {
	e.t.Helper()

	doc := e.status(e.traefik.Web + "/v1/_ratelimit")
	counts := map[string]int64{}

	for _, it := range doc.Keys.Items {
		if it.Layer == layer {
			counts[it.Key] = it.Count
		}
	}

	for _, l := range doc.Layers {
		if l.Name == layer {
			return counts, l.Refused
		}
	}

	e.t.Fatalf("no layer %s on the status page", layer)

	return nil, 0
}

// newKey is the one key of counts that is not in seen.
func newKey(t *testing.T, counts map[string]int64, seen ...string) string {
	t.Helper()

	var out []string

	for k := range counts {
		if !slices.Contains(seen, k) {
			out = append(out, k)
		}
	}

	if len(out) != 1 {
		t.Fatalf("keys %v beside %v: want one new key", counts, seen)
	}

	return out[0]
}

// TestSDKOpenAIGzipAnswersChargedPerKey: openai-go's completions (Go's
// client accepts gzip, and the API answers gzip) are charged the usage of
// their compressed answers: a key with 1000 tokens a minute makes three
// calls of 400 tokens, the fourth is refused (with the SDK's retries off),
// another key's call passes; a stream charges its final usage chunk.
func TestSDKOpenAIGzipAnswersChargedPerKey(t *testing.T) {
	e, llm := startSDK(t, fakellm.Usage{Input: 100, Output: 300}, `
            - {name: tpm, methods: [POST], paths: [/v1/chat/completions], key: "header:Authorization", points: 1000, duration: 60s, costFrom: "llm:total"}`)
	ctx := sdkContext(t)

	alice := openaiClient(e, "sk-alice", option.WithMaxRetries(0))

	for i := 1; i <= 4; i++ {
		c, err := alice.Chat.Completions.New(ctx, chatParams("hi"))

		if i == 4 {
			if statusOf(err) != http.StatusTooManyRequests {
				t.Fatalf("call 4 of 400 tokens against 1000 a minute: %v, want a 429 (the usage of the gzip answers was not charged)", err)
			}

			break
		}

		if err != nil || c.Choices[0].Message.Content != said || c.Usage.TotalTokens != 400 {
			t.Fatalf("call %d: %v (%+v)", i, err, c)
		}
	}

	checkGzipped(t, llm, 3)

	if _, err := openaiClient(e, "sk-bob", option.WithMaxRetries(0)).Chat.Completions.New(ctx, chatParams("hi")); err != nil {
		t.Fatalf("another key's call: %v", err)
	}

	counts, refused := e.layerCounts("tpm")
	if len(counts) != 2 || refused != 1 {
		t.Fatalf("keys %v, %d refused: want alice's and bob's, one refusal", counts, refused)
	}

	// A stream states its usage in its last chunk, when asked to.
	params := chatParams("hi")
	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := openaiClient(e, "sk-carol", option.WithMaxRetries(0)).Chat.Completions.NewStreaming(ctx, params)
	acc := openai.ChatCompletionAccumulator{}

	for stream.Next() {
		acc.AddChunk(stream.Current())
	}

	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content != said || acc.Usage.TotalTokens != 400 {
		t.Fatalf("stream: %v (%q, %+v)", err, acc.Choices[0].Message.Content, acc.Usage)
	}

	checkGzipped(t, llm, 5)

	after, _ := e.layerCounts("tpm")
	if carol := after[newKey(t, after, keysOf(counts)...)]; carol != 400 {
		t.Fatalf("a stream of 400 tokens counted %d", carol)
	}
}

func keysOf(m map[string]int64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}

	return out
}

// anthropic-sdk-go v2 sends its API key as Authorization: Bearer, as openai-go does.

// TestSDKAnthropicMessagesChargedInputPlusOutput: anthropic-sdk-go's
// messages, JSON and streamed, gzip-compressed, are charged their input
// (input_tokens with the cache reads and writes; in a stream, message_start's)
// plus their output (in a stream, message_delta's): 175 + 300.
func TestSDKAnthropicMessagesChargedInputPlusOutput(t *testing.T) {
	e, llm := startSDK(t, fakellm.Usage{Input: 175, CacheRead: 100, CacheWrite: 50, Output: 300}, `
            - {name: tokens, methods: [POST], paths: [/v1/messages], key: "header:Authorization", points: 100000, duration: 60s, costFrom: "llm:input + llm:output"}`)
	ctx := sdkContext(t)

	m, err := anthropicClient(e, "ant-json").Messages.New(ctx, messageParams())
	if err != nil || m.Content[0].Text != said || m.Usage.InputTokens != 25 || m.Usage.OutputTokens != 300 {
		t.Fatalf("message: %v (%+v)", err, m)
	}

	counts, _ := e.layerCounts("tokens")
	jsonKey := newKey(t, counts)

	if counts[jsonKey] != 475 {
		t.Fatalf("a message of 25 + 100 cache read + 50 cache write input and 300 output tokens counted %d, want 475", counts[jsonKey])
	}

	stream := anthropicClient(e, "ant-stream").Messages.NewStreaming(ctx, messageParams())
	acc := anthropic.Message{}

	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}

	if err := stream.Err(); err != nil || acc.Content[0].Text != said || acc.Usage.CacheReadInputTokens != 100 || acc.Usage.OutputTokens != 300 {
		t.Fatalf("stream: %v (%+v)", err, acc)
	}

	checkGzipped(t, llm, 2)

	counts, _ = e.layerCounts("tokens")
	if got := counts[newKey(t, counts, jsonKey)]; got != 475 {
		t.Fatalf("a stream of 175 input tokens (message_start) and 300 output (message_delta) counted %d, want 475", got)
	}
}

// TestSDKResponsesStreamChargedAWeightedSum: openai-go's Responses API
// stream is charged llm:input + 4*llm:output from its response.completed
// event (120 + 4*50), which the next call's headers show the client; a JSON
// response is charged the same.
func TestSDKResponsesStreamChargedAWeightedSum(t *testing.T) {
	e, llm := startSDK(t, fakellm.Usage{Input: 120, CacheRead: 20, Output: 50}, `
            - {name: weighted, methods: [POST], paths: [/v1/responses], key: "header:Authorization", points: 10000, duration: 60s, costFrom: "llm:input + 4*llm:output"}`)
	ctx := sdkContext(t)
	client := openaiClient(e, "sk-weighted", option.WithMaxRetries(0))
	params := responses.ResponseNewParams{Model: "gpt-5-mini", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}

	stream := client.Responses.NewStreaming(ctx, params)
	text, completed := "", responses.ResponseUsage{}

	for stream.Next() {
		switch ev := stream.Current(); ev.Type {
		case "response.output_text.delta":
			text += ev.Delta
		case "response.completed":
			completed = ev.Response.Usage
		}
	}

	if err := stream.Err(); err != nil || text != said || completed.InputTokens != 120 || completed.OutputTokens != 50 {
		t.Fatalf("stream: %v (%q, %+v)", err, text, completed)
	}

	counts, _ := e.layerCounts("weighted")
	if got := counts[newKey(t, counts)]; got != 320 {
		t.Fatalf("a stream of 120 input and 50 output tokens counted %d, want 120 + 4*50 = 320", got)
	}

	// The next call is admitted holding its reservation (1) beside the 320.
	var raw *http.Response

	r, err := client.Responses.New(ctx, params, option.WithResponseInto(&raw))
	if err != nil || r.OutputText() != said {
		t.Fatalf("JSON response: %v", err)
	}

	if raw.ProtoMajor != 2 {
		t.Fatalf("the SDK's call went over %s, want HTTP/2 (h2c)", raw.Proto)
	}

	if got := raw.Header.Get("X-RateLimit-Remaining"); got != "9679" {
		t.Fatalf("X-RateLimit-Remaining %q after a stream of 320 points, want 9679 (10000 - 320 - 1 reserved)", got)
	}

	checkGzipped(t, llm, 2)

	counts, _ = e.layerCounts("weighted")
	if got := counts[newKey(t, counts)]; got != 640 {
		t.Fatalf("a stream and a JSON response of 320 points each counted %d", got)
	}
}

// attempts records the status of each HTTP attempt an SDK makes (an SDK
// middleware runs once per attempt, retries included).
type attempts struct {
	mu       sync.Mutex
	statuses []int
}

func (a *attempts) record(code int) {
	a.mu.Lock()
	defer a.mu.Unlock()

	a.statuses = append(a.statuses, code)
}

func (a *attempts) String() string {
	a.mu.Lock()
	defer a.mu.Unlock()

	var out []string
	for _, s := range a.statuses {
		out = append(out, http.StatusText(s))
	}

	return strings.Join(out, ", ")
}

func (a *attempts) openai(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	resp, err := next(req)
	if err == nil {
		a.record(resp.StatusCode)
	}

	return resp, err
}

func (a *attempts) anthropic(req *http.Request, next aoption.MiddlewareNext) (*http.Response, error) {
	resp, err := next(req)
	if err == nil {
		a.record(resp.StatusCode)
	}

	return resp, err
}

// TestSDKRetryLandsOnceTheWindowHasRoom: a key spends its 1000 tokens of a
// 2s window in one call; its next call is refused, and the SDK's automatic
// retry waits for the refusal's Retry-After (tierlimit sends no
// retry-after-ms, which the SDKs would read first): the retry reaches the
// API once, after the window's reset, and succeeds. No attempt lands before
// the reset: one refusal, two calls reach the API.
func TestSDKRetryLandsOnceTheWindowHasRoom(t *testing.T) {
	e, llm := startSDK(t, fakellm.Usage{Input: 400, Output: 600}, `
            - {name: openai, methods: [POST], paths: [/v1/chat/completions], key: "header:Authorization", points: 1000, duration: 2s, costFrom: "llm:total"}
            - {name: anthropic, methods: [POST], paths: [/v1/messages], key: "header:Authorization", points: 1000, duration: 2s, costFrom: "llm:total"}`)
	ctx := sdkContext(t)

	check := func(t *testing.T, layer string, a *attempts, err error, calls int) {
		t.Helper()

		if err != nil || a.String() != "OK, Too Many Requests, OK" {
			t.Fatalf("%v; attempts: %s, want OK, Too Many Requests, OK (one refusal, then a retry after the reset)", err, a)
		}

		got := llm.Calls()
		if len(got) != calls || got[calls-1].Retry != "1" {
			t.Fatalf("the API answered %+v: want the first call, then the retry (X-Stainless-Retry-Count 1)", got)
		}

		if _, refused := e.layerCounts(layer); refused != 1 {
			t.Fatalf("%s refused %d requests, want 1: an attempt landed before the window's reset", layer, refused)
		}
	}

	t.Run("openai-go", func(t *testing.T) {
		a := &attempts{}
		client := openaiClient(e, "sk-retry", option.WithMaxRetries(2), option.WithMiddleware(a.openai))

		_, err := client.Chat.Completions.New(ctx, chatParams("spend the window"))
		if err == nil {
			_, err = client.Chat.Completions.New(ctx, chatParams("retried"))
		}

		check(t, "openai", a, err, 2)
	})

	t.Run("anthropic-sdk-go", func(t *testing.T) {
		a := &attempts{}
		client := anthropicClient(e, "ant-retry", aoption.WithMaxRetries(2), aoption.WithMiddleware(a.anthropic))

		_, err := client.Messages.New(ctx, messageParams())
		if err == nil {
			_, err = client.Messages.New(ctx, messageParams())
		}

		check(t, "anthropic", a, err, 4)
	})
}

// sentDigests is an openai-go middleware that keeps the digest of each body
// the SDK sends (fakellm.Digest).
type sentDigests struct {
	mu      sync.Mutex
	digests []string
}

func (s *sentDigests) openai(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	if req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			data, _ := io.ReadAll(body)

			s.mu.Lock()
			s.digests = append(s.digests, fakellm.Digest(data))
			s.mu.Unlock()
		}
	}

	return next(req)
}

// TestSDKBudgetPerKeyPerModel: a route keyed by the API key and the
// request's model (key: "header:Authorization,json:model") gives each key
// 1000 tokens a minute per model, although openai-go writes the model after
// the conversation (here 120 KB of it): three calls of 400 tokens to one
// model pass and the fourth is refused, while the same key's call to another
// model and another key's call to the first pass; the API receives every
// body as the SDK sent it.
func TestSDKBudgetPerKeyPerModel(t *testing.T) {
	e, llm := startSDK(t, fakellm.Usage{Input: 100, Output: 300}, `
            - {name: per-model, methods: [POST], paths: [/v1/chat/completions], key: "header:Authorization,json:model", points: 1000, duration: 60s, costFrom: "llm:total"}`)
	ctx := sdkContext(t)
	sent := &sentDigests{}

	long := chatParams(strings.Repeat("A long conversation. ", 6000))
	call := func(key string, model string) error {
		p := long
		p.Model = model

		_, err := openaiClient(e, key, option.WithMaxRetries(0), option.WithMiddleware(sent.openai)).Chat.Completions.New(ctx, p)

		return err
	}

	for i := 1; i <= 4; i++ {
		err := call("sk-alice", "gpt-5-mini")
		if i < 4 && err != nil {
			t.Fatalf("alice's call %d to gpt-5-mini: %v", i, err)
		}

		if i == 4 && statusOf(err) != http.StatusTooManyRequests {
			t.Fatalf("alice's call 4 to gpt-5-mini (400 tokens each, 1000 a minute): %v, want a 429", err)
		}
	}

	if err := call("sk-alice", "gpt-5"); err != nil {
		t.Fatalf("alice's call to another model: %v (the models share a budget)", err)
	}

	if err := call("sk-bob", "gpt-5-mini"); err != nil {
		t.Fatalf("bob's call to gpt-5-mini: %v (the keys share a budget)", err)
	}

	calls := llm.Calls()
	if len(calls) != 5 {
		t.Fatalf("the API answered %d calls, want 5", len(calls))
	}

	for i, c := range calls {
		if c.ModelOffset < 100<<10 {
			t.Fatalf("call %d: the model at byte %d, want past 100 KB of messages", i+1, c.ModelOffset)
		}

		if !slices.Contains(sent.digests, c.Digest) {
			t.Fatalf("call %d: the API received a body the SDK did not send", i+1)
		}
	}
}
