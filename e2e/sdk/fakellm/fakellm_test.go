package fakellm

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
)

// The SDKs read the fake's answers, JSON and streams, gzip-compressed (Go's
// client accepts gzip), as the real APIs': the text and each usage field.

var u = Usage{Input: 175, CacheRead: 100, CacheWrite: 50, Output: 300}

const said = "Hello from the fake API."

func serve(t *testing.T) (*Server, string) {
	s := New(u)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)

	return s, srv.URL
}

func checkCalls(t *testing.T, s *Server, n int) {
	t.Helper()

	calls := s.Calls()
	if len(calls) != n {
		t.Fatalf("%d calls, want %d", len(calls), n)
	}

	for _, c := range calls {
		if !c.Gzip || c.Model == "" || c.ModelOffset < 0 || c.Retry != "0" {
			t.Errorf("call %+v: want gzip, a model and a first attempt", c)
		}
	}
}

func TestOpenAIChatCompletions(t *testing.T) {
	s, url := serve(t)
	client := openai.NewClient(option.WithAPIKey("k"), option.WithBaseURL(url+"/v1/"), option.WithMaxRetries(0))
	params := openai.ChatCompletionNewParams{Model: "gpt-5-mini", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}}

	c, err := client.Chat.Completions.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}

	if c.Choices[0].Message.Content != said || c.Usage.PromptTokens != 175 || c.Usage.CompletionTokens != 300 ||
		c.Usage.TotalTokens != 475 || c.Usage.PromptTokensDetails.CachedTokens != 100 {
		t.Fatalf("completion %q, usage %+v", c.Choices[0].Message.Content, c.Usage)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	stream := client.Chat.Completions.NewStreaming(context.Background(), params)
	acc := openai.ChatCompletionAccumulator{}

	for stream.Next() {
		acc.AddChunk(stream.Current())
	}

	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content != said || acc.Usage.TotalTokens != 475 {
		t.Fatalf("stream %q, usage %+v, %v", acc.Choices[0].Message.Content, acc.Usage, err)
	}

	checkCalls(t, s, 2)
}

func TestOpenAIResponses(t *testing.T) {
	s, url := serve(t)
	client := openai.NewClient(option.WithAPIKey("k"), option.WithBaseURL(url+"/v1/"), option.WithMaxRetries(0))
	params := responses.ResponseNewParams{Model: "gpt-5-mini", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}

	r, err := client.Responses.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}

	if r.OutputText() != said || r.Usage.InputTokens != 175 || r.Usage.OutputTokens != 300 || r.Usage.InputTokensDetails.CachedTokens != 100 {
		t.Fatalf("response %q, usage %+v", r.OutputText(), r.Usage)
	}

	stream := client.Responses.NewStreaming(context.Background(), params)
	text, completed := "", responses.ResponseUsage{}

	for stream.Next() {
		switch e := stream.Current(); e.Type {
		case "response.output_text.delta":
			text += e.Delta
		case "response.completed":
			completed = e.Response.Usage
		}
	}

	if err := stream.Err(); err != nil || text != said || completed.InputTokens != 175 || completed.OutputTokens != 300 {
		t.Fatalf("stream %q, usage %+v, %v", text, completed, err)
	}

	checkCalls(t, s, 2)
}

func TestAnthropicMessages(t *testing.T) {
	s, url := serve(t)
	client := anthropic.NewClient(aoption.WithAPIKey("k"), aoption.WithBaseURL(url), aoption.WithMaxRetries(0))
	params := anthropic.MessageNewParams{Model: "claude-haiku-4-5", MaxTokens: 1024,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}}

	m, err := client.Messages.New(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}

	want := anthropic.Usage{InputTokens: 25, CacheReadInputTokens: 100, CacheCreationInputTokens: 50, OutputTokens: 300}
	if m.Content[0].Text != said || !sameUsage(m.Usage, want) {
		t.Fatalf("message %+v, usage %+v", m.Content, m.Usage)
	}

	stream := client.Messages.NewStreaming(context.Background(), params)
	acc := anthropic.Message{}

	for stream.Next() {
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}

	if err := stream.Err(); err != nil || acc.Content[0].Text != said || !sameUsage(acc.Usage, want) {
		t.Fatalf("stream %+v, usage %+v, %v", acc.Content, acc.Usage, err)
	}

	checkCalls(t, s, 2)
}

func sameUsage(a, b anthropic.Usage) bool {
	return a.InputTokens == b.InputTokens && a.CacheReadInputTokens == b.CacheReadInputTokens &&
		a.CacheCreationInputTokens == b.CacheCreationInputTokens && a.OutputTokens == b.OutputTokens
}

func TestAcceptsGzip(t *testing.T) {
	for accept, want := range map[string]bool{
		"gzip": true, "gzip, deflate, br": true, "br;q=1, GZIP;q=0.5": true, "x-gzip": true,
		"": false, "identity": false, "gzip;q=0": false, "br, zstd": false,
	} {
		if got := acceptsGzip(accept); got != want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", accept, got, want)
		}
	}
}

func TestModelOffset(t *testing.T) {
	for body, want := range map[string]int64{
		`{"model":"m"}`: 1,
		`{"messages":[{"model":"x"}],"model":"m"}`: 28,
		`{"messages":[]}`:                          -1,
		`[]`:                                       -1,
	} {
		if got := modelOffset([]byte(body)); got != want {
			t.Errorf("modelOffset(%s) = %d, want %d", body, got, want)
		}
	}
}
