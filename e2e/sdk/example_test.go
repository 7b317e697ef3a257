package sdk

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/tierlimit/tierlimit/e2e/fakeauth"
	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/e2e/sdk/fakellm"
)

// asWritten is one of examples/llm's files, its placeholders' addresses
// replaced (each must occur exactly once, so that a change of the example
// that the test would not follow fails here).
func asWritten(t *testing.T, name string, replace ...string) string {
	t.Helper()

	raw, err := os.ReadFile(filepath.Join(harness.RepoRoot(), "examples", "llm", name))
	if err != nil {
		t.Fatal(err)
	}

	s := string(raw)
	for i := 0; i+1 < len(replace); i += 2 {
		if n := strings.Count(s, replace[i]); n != 1 {
			t.Fatalf("examples/llm/%s holds %q %d times, want once", name, replace[i], n)
		}

		s = strings.Replace(s, replace[i], replace[i+1], 1)
	}

	return s
}

// startExample runs examples/llm as written: Traefik started as its
// traefik.yml says (`traefik --configFile=traefik.yml` in a directory
// holding dynamic.yml and plugins-local/), its entrypoint on a free
// loopback port instead of :8080, the auth server and the LLM API pointed
// at the test's. It returns once the llm router serves.
func startExample(t *testing.T, llm http.Handler) *env {
	t.Helper()

	llmURL, stopLLM, err := harness.Serve("127.0.0.1:0", llm)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopLLM)

	authURL, stopAuth, err := harness.Serve("127.0.0.1:0", fakeauth.Handler())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stopAuth)

	port, err := harness.FreePort()
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	web := "127.0.0.1:" + strconv.Itoa(port)
	static := asWritten(t, "traefik.yml", `address: ":8080"`, `address: "`+web+`"`)
	dynamic := asWritten(t, "dynamic.yml", "http://auth:9000", authURL, "http://llm:8000", llmURL)

	for name, content := range map[string]string{"traefik.yml": static, "dynamic.yml": dynamic} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	tr, err := harness.StartAsWritten(dir)
	if err != nil {
		t.Fatal(err)
	}

	tr.Web = "http://" + web

	t.Cleanup(func() {
		tr.Stop()

		if t.Failed() {
			t.Logf("traefik output:\n%s", tail(tr.Logs(), 30))
		}
	})

	h2c := h2cTransport()
	t.Cleanup(h2c.CloseIdleConnections)

	e := &env{t: t, traefik: tr, client: &http.Client{Transport: h2c, Timeout: 10 * time.Second}}

	// The configuration has no API to ask for the router: it serves once a
	// request under /v1/ is not Traefik's 404 (a guest's GET, which the API
	// refuses with a 400).
	deadline := time.Now().Add(60 * time.Second)
	for {
		last := ""
		resp, err := e.client.Get(tr.Web + "/v1/models")
		if err != nil {
			last = err.Error()
		} else {
			resp.Body.Close()

			if resp.StatusCode != http.StatusNotFound {
				break
			}

			last = resp.Status
		}

		if tr.Exited() || time.Now().After(deadline) {
			t.Fatalf("examples/llm did not serve /v1/ within 60s (exited: %v, last answer: %s)", tr.Exited(), last)
		}

		time.Sleep(100 * time.Millisecond)
	}

	return e
}

// holder is the LLM API holding each request for the model "held" until
// released, so that it stays in flight.
type holder struct {
	next    http.Handler
	entered chan struct{}

	mu      sync.Mutex
	release []chan struct{}
}

func newHolder(next http.Handler) *holder {
	return &holder{next: next, entered: make(chan struct{}, 8)}
}

func (h *holder) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	req.Body = io.NopCloser(bytes.NewReader(body))

	if bytes.Contains(body, []byte(`"model":"held"`)) {
		ch := make(chan struct{})

		h.mu.Lock()
		h.release = append(h.release, ch)
		h.mu.Unlock()

		h.entered <- struct{}{}
		<-ch
	}

	h.next.ServeHTTP(rw, req)
}

// releaseOne lets the oldest held request be answered.
func (h *holder) releaseOne() {
	h.mu.Lock()
	defer h.mu.Unlock()

	close(h.release[0])
	h.release = h.release[1:]
}

// rateLimitError is the SDK's error for a 429 in OpenAI's shape, which the
// example's response.body writes; nil for anything else.
func rateLimitError(err error) *openai.Error {
	var oe *openai.Error
	if errors.As(err, &oe) && oe.StatusCode == http.StatusTooManyRequests && oe.Type == "rate_limit_exceeded" && oe.Code == "rate_limit_exceeded" {
		return oe
	}

	return nil
}

// TestLLMExampleAsWrittenWithTheOpenAISDK runs examples/llm as written
// (traefik.yml and dynamic.yml, only the addresses changed), called by
// openai-go against an API that answers as OpenAI's, gzip-compressed,
// 4000 tokens a call:
//   - a free key's 10000 tokens a minute admit three calls, JSON and
//     streamed (the third holds the last 500-token reservation that fits),
//     each answer's RateLimit showing its tokens left beside its slots; the
//     fourth is refused with the 429 that the SDK reads as OpenAI's
//     rate_limit_exceeded, naming tokens_minute.free;
//   - a pro key holds 2 requests in flight: a third is refused (inflight),
//     and once one has ended another is admitted.
func TestLLMExampleAsWrittenWithTheOpenAISDK(t *testing.T) {
	llm := fakellm.New(fakellm.Usage{Input: 3000, Output: 1000})
	hold := newHolder(llm)
	e := startExample(t, hold)
	ctx := sdkContext(t)

	ann := openaiClient(e, "user-ann@free", option.WithMaxRetries(0))

	for i, left := range []int{9500, 5500, 1500} {
		var raw *http.Response
		var total int64
		var err error

		if i == 1 {
			params := chatParams("hi")
			params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			stream := ann.Chat.Completions.NewStreaming(ctx, params, option.WithResponseInto(&raw))
			acc := openai.ChatCompletionAccumulator{}

			for stream.Next() {
				acc.AddChunk(stream.Current())
			}

			err, total = stream.Err(), acc.Usage.TotalTokens
		} else {
			var c *openai.ChatCompletion
			c, err = ann.Chat.Completions.New(ctx, chatParams("hi"), option.WithResponseInto(&raw))
			if c != nil {
				total = c.Usage.TotalTokens
			}
		}

		if err != nil || total != 4000 {
			t.Fatalf("free call %d: %v, %d tokens; want 4000", i+1, err, total)
		}

		rl, policy := raw.Header.Get("RateLimit"), raw.Header.Get("RateLimit-Policy")
		if !strings.HasPrefix(policy, `"inflight";q=2;`) || !strings.Contains(rl, `"tokens_minute.free";r=`+strconv.Itoa(left)+";") ||
			!strings.Contains(rl, `"tokens_day.free";r=`) || !strings.Contains(rl, `"free";r=`) {
			t.Fatalf("free call %d: RateLimit-Policy %q, RateLimit %q; want inflight first and tokens_minute.free r=%d, tokens_day.free and free beside", i+1, policy, rl, left)
		}
	}

	checkGzipped(t, llm, 3)

	_, err := ann.Chat.Completions.New(ctx, chatParams("hi"))
	if oe := rateLimitError(err); oe == nil || !strings.Contains(oe.Message, "tokens_minute.free") {
		t.Fatalf("free call 4: %v, want OpenAI's rate_limit_exceeded for tokens_minute.free", err)
	}

	// A pro key, 2 requests in flight.
	bob := openaiClient(e, "user-bob@pro", option.WithMaxRetries(0))
	held := make(chan error, 2)

	for i := 0; i < 2; i++ {
		go func() {
			params := chatParams("hold me")
			params.Model = "held"
			_, err := bob.Chat.Completions.New(ctx, params)
			held <- err
		}()

		<-hold.entered
	}

	_, err = bob.Chat.Completions.New(ctx, chatParams("a third in flight"))
	if oe := rateLimitError(err); oe == nil || !strings.Contains(oe.Message, "inflight") {
		t.Fatalf("a third request in flight: %v, want OpenAI's rate_limit_exceeded for inflight", err)
	}

	hold.releaseOne()
	if err := <-held; err != nil {
		t.Fatalf("a held call, released: %v", err)
	}

	// Its slot is given back once its handler has returned, a moment after
	// the client has the answer.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err = bob.Chat.Completions.New(ctx, chatParams("in the freed slot"))
		if err == nil {
			break
		}

		if oe := rateLimitError(err); oe == nil || !strings.Contains(oe.Message, "inflight") || time.Now().After(deadline) {
			t.Fatalf("beside one request in flight: %v, want it admitted within 5s", err)
		}

		time.Sleep(20 * time.Millisecond)
	}

	hold.releaseOne()
	if err := <-held; err != nil {
		t.Fatalf("the other held call, released: %v", err)
	}
}
