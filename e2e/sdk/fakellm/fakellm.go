// Package fakellm is an LLM API for the tests: it answers OpenAI's Chat
// Completions (POST /v1/chat/completions) and Responses (POST /v1/responses)
// and Anthropic's Messages (POST /v1/messages) in those APIs' own JSON and
// event-stream formats, with the usage each states, so that the official SDKs
// read its answers as the real APIs'. Like the APIs (and nginx with
// `gzip on`), it answers gzip-compressed when the request accepts gzip, as
// Go's HTTP client does by default; a stream is compressed too, its
// compressor flushed after each event.
package fakellm

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Usage is what every answer states, in each API's own fields.
type Usage struct {
	// Input is every input token: OpenAI's prompt_tokens and input_tokens;
	// Anthropic's input_tokens + cache_read_input_tokens +
	// cache_creation_input_tokens.
	Input int64
	// CacheRead is the part of Input read from a cache: OpenAI's
	// cached_tokens, Anthropic's cache_read_input_tokens.
	CacheRead int64
	// CacheWrite is the part of Input written to a cache: Anthropic's
	// cache_creation_input_tokens (OpenAI states none).
	CacheWrite int64
	// Output is every output token: completion_tokens, output_tokens.
	Output int64
}

// Call is a request the server answered.
type Call struct {
	Path  string
	Key   string // Authorization (OpenAI) or X-Api-Key (Anthropic)
	Model string
	// ModelOffset is where the body's top-level "model" member starts: the
	// bytes the SDK wrote before it.
	ModelOffset int64
	Stream      bool
	// Gzip: the answer was gzip-compressed (the request accepted gzip).
	Gzip bool
	// Retry is the SDK's X-Stainless-Retry-Count: 0 for a first attempt.
	Retry string
	// Digest is the body's SHA-256 (Digest), to compare with what the client sent.
	Digest string
}

// Digest is the hexadecimal SHA-256 of body.
func Digest(body []byte) string {
	sum := sha256.Sum256(body)
	return hex.EncodeToString(sum[:])
}

// Server is the fake API; set Usage before it serves.
type Server struct {
	mu    sync.Mutex
	usage Usage
	calls []Call
}

// New returns a Server whose answers state u.
func New(u Usage) *Server {
	return &Server{usage: u}
}

// Calls returns the requests answered so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()

	return append([]Call(nil), s.calls...)
}

// request is what the server reads of a request body.
type request struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (s *Server) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)

	var r request
	if err == nil {
		err = json.Unmarshal(body, &r)
	}

	if err != nil || r.Model == "" || req.Method != http.MethodPost {
		apiError(rw, http.StatusBadRequest, "invalid_request_error", "a POST of a JSON body with a model")
		return
	}

	c := Call{Path: req.URL.Path, Key: req.Header.Get("Authorization"), Model: r.Model, ModelOffset: modelOffset(body),
		Stream: r.Stream, Gzip: acceptsGzip(req.Header.Get("Accept-Encoding")), Retry: req.Header.Get("X-Stainless-Retry-Count"),
		Digest: Digest(body)}
	if k := req.Header.Get("X-Api-Key"); k != "" {
		c.Key = k
	}

	s.mu.Lock()
	s.calls = append(s.calls, c)
	u, n := s.usage, len(s.calls)
	s.mu.Unlock()

	var events []event

	switch req.URL.Path {
	case "/v1/chat/completions":
		events = chatCompletion(r, u, n)
	case "/v1/responses":
		events = response(r, u, n)
	case "/v1/messages":
		events = message(r, u, n)
	default:
		apiError(rw, http.StatusNotFound, "not_found_error", "no such API: "+req.URL.Path)
		return
	}

	write(rw, events, r.Stream, c.Gzip)
}

// event is one event of a stream (name empty: a data-only event, as Chat
// Completions sends), or the whole JSON body when it is not streamed.
type event struct {
	name string
	data interface{}
}

// write sends a JSON body (the last event's data) or the event stream,
// compressed when gz.
func write(rw http.ResponseWriter, events []event, stream, gz bool) {
	h := rw.Header()
	h.Set("Content-Type", "application/json")

	if stream {
		h.Set("Content-Type", "text/event-stream; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
	}

	var out io.Writer = rw

	flush := func() { http.NewResponseController(rw).Flush() }

	if gz {
		h.Set("Content-Encoding", "gzip")
		h.Set("Vary", "Accept-Encoding")

		zw := gzip.NewWriter(rw)
		defer zw.Close()

		out = zw
		flush = func() {
			_ = zw.Flush()
			http.NewResponseController(rw).Flush()
		}
	}

	rw.WriteHeader(http.StatusOK)

	if !stream {
		_ = json.NewEncoder(out).Encode(events[len(events)-1].data)
		return
	}

	for _, e := range events {
		data, _ := json.Marshal(e.data)
		if s, ok := e.data.(string); ok {
			data = []byte(s) // [DONE]
		}

		if e.name != "" {
			fmt.Fprintf(out, "event: %s\n", e.name)
		}

		fmt.Fprintf(out, "data: %s\n\n", data)
		flush()
	}
}

// text is what every answer says, word by word in a stream.
var text = []string{"Hello", " from", " the", " fake", " API."}

// obj is a JSON object.
type obj = map[string]interface{}

// chatCompletion is a Chat Completion, or its chunks ending with the usage
// chunk (choices empty) when stream_options.include_usage is set, the other
// chunks' usage then being null.
func chatCompletion(r request, u Usage, n int) []event {
	id, created := "chatcmpl-fake"+strconv.Itoa(n), time.Now().Unix()
	usage := obj{
		"prompt_tokens": u.Input, "completion_tokens": u.Output, "total_tokens": u.Input + u.Output,
		"prompt_tokens_details":     obj{"cached_tokens": u.CacheRead, "audio_tokens": 0},
		"completion_tokens_details": obj{"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
	}

	if !r.Stream {
		return []event{{data: obj{
			"id": id, "object": "chat.completion", "created": created, "model": r.Model, "system_fingerprint": "fp_fake",
			"choices": []obj{{"index": 0, "logprobs": nil, "finish_reason": "stop",
				"message": obj{"role": "assistant", "content": strings.Join(text, ""), "refusal": nil, "annotations": []obj{}}}},
			"usage": usage, "service_tier": "default",
		}}}
	}

	withUsage := r.StreamOptions != nil && r.StreamOptions.IncludeUsage
	chunk := func(choices []obj, u interface{}) event {
		c := obj{"id": id, "object": "chat.completion.chunk", "created": created, "model": r.Model,
			"system_fingerprint": "fp_fake", "service_tier": "default", "choices": choices}
		if withUsage {
			c["usage"] = u
		}

		return event{data: c}
	}

	events := []event{chunk([]obj{{"index": 0, "delta": obj{"role": "assistant", "content": "", "refusal": nil}, "logprobs": nil, "finish_reason": nil}}, nil)}
	for _, w := range text {
		events = append(events, chunk([]obj{{"index": 0, "delta": obj{"content": w}, "logprobs": nil, "finish_reason": nil}}, nil))
	}

	events = append(events, chunk([]obj{{"index": 0, "delta": obj{}, "logprobs": nil, "finish_reason": "stop"}}, nil))
	if withUsage {
		events = append(events, chunk([]obj{}, usage))
	}

	return append(events, event{data: "[DONE]"})
}

// response is a Responses API response, or its events from response.created
// to response.completed, which alone states the usage (response.usage).
func response(r request, u Usage, n int) []event {
	id, msg, created := "resp_fake"+strconv.Itoa(n), "msg_fake"+strconv.Itoa(n), time.Now().Unix()
	all := strings.Join(text, "")
	part := func(t string) obj {
		return obj{"type": "output_text", "text": t, "annotations": []obj{}, "logprobs": []obj{}}
	}
	item := func(status string, content []obj) obj {
		return obj{"type": "message", "id": msg, "status": status, "role": "assistant", "content": content}
	}
	resp := func(status string, output []obj, usage interface{}) obj {
		return obj{"id": id, "object": "response", "created_at": created, "status": status, "background": false,
			"error": nil, "incomplete_details": nil, "instructions": nil, "max_output_tokens": nil, "model": r.Model,
			"output": output, "parallel_tool_calls": true, "previous_response_id": nil,
			"reasoning": obj{"effort": nil, "summary": nil}, "store": true, "temperature": 1.0,
			"text": obj{"format": obj{"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto", "tools": []obj{},
			"top_p": 1.0, "truncation": "disabled", "usage": usage, "user": nil, "metadata": obj{}}
	}
	usage := obj{"input_tokens": u.Input, "input_tokens_details": obj{"cached_tokens": u.CacheRead},
		"output_tokens": u.Output, "output_tokens_details": obj{"reasoning_tokens": 0}, "total_tokens": u.Input + u.Output}
	done := resp("completed", []obj{item("completed", []obj{part(all)})}, usage)

	if !r.Stream {
		return []event{{data: done}}
	}

	var events []event

	add := func(typ string, fields obj) {
		fields["type"], fields["sequence_number"] = typ, len(events)
		events = append(events, event{name: typ, data: fields})
	}
	at := func(fields obj) obj {
		fields["item_id"], fields["output_index"], fields["content_index"] = msg, 0, 0
		return fields
	}

	add("response.created", obj{"response": resp("in_progress", []obj{}, nil)})
	add("response.in_progress", obj{"response": resp("in_progress", []obj{}, nil)})
	add("response.output_item.added", obj{"output_index": 0, "item": item("in_progress", []obj{})})
	add("response.content_part.added", at(obj{"part": part("")}))

	for _, w := range text {
		add("response.output_text.delta", at(obj{"delta": w, "logprobs": []obj{}}))
	}

	add("response.output_text.done", at(obj{"text": all, "logprobs": []obj{}}))
	add("response.content_part.done", at(obj{"part": part(all)}))
	add("response.output_item.done", obj{"output_index": 0, "item": item("completed", []obj{part(all)})})
	add("response.completed", obj{"response": done})

	return events
}

// message is an Anthropic Message, or its stream: message_start states the
// input (message.usage, output_tokens 1 so far) and message_delta the
// output (usage.output_tokens), as the API's documentation shows them (the
// live API repeats the input in message_delta's usage).
func message(r request, u Usage, n int) []event {
	id := "msg_fake" + strconv.Itoa(n)
	usage := func(output int64) obj {
		return obj{"input_tokens": u.Input - u.CacheRead - u.CacheWrite, "cache_creation_input_tokens": u.CacheWrite,
			"cache_read_input_tokens": u.CacheRead, "output_tokens": output, "service_tier": "standard"}
	}
	msg := func(content []obj, stop interface{}, u obj) obj {
		return obj{"id": id, "type": "message", "role": "assistant", "model": r.Model, "content": content,
			"stop_reason": stop, "stop_sequence": nil, "usage": u}
	}

	if !r.Stream {
		return []event{{data: msg([]obj{{"type": "text", "text": strings.Join(text, "")}}, "end_turn", usage(u.Output))}}
	}

	events := []event{
		{"message_start", obj{"type": "message_start", "message": msg([]obj{}, nil, usage(1))}},
		{"content_block_start", obj{"type": "content_block_start", "index": 0, "content_block": obj{"type": "text", "text": ""}}},
		{"ping", obj{"type": "ping"}},
	}

	for _, w := range text {
		events = append(events, event{"content_block_delta", obj{"type": "content_block_delta", "index": 0,
			"delta": obj{"type": "text_delta", "text": w}}})
	}

	return append(events,
		event{"content_block_stop", obj{"type": "content_block_stop", "index": 0}},
		event{"message_delta", obj{"type": "message_delta", "delta": obj{"stop_reason": "end_turn", "stop_sequence": nil},
			"usage": obj{"output_tokens": u.Output}}},
		event{"message_stop", obj{"type": "message_stop"}},
	)
}

// apiError answers an error in OpenAI's shape, which Anthropic's SDK reads too.
func apiError(rw http.ResponseWriter, code int, typ, msg string) {
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(obj{"type": "error", "error": obj{"type": typ, "message": msg}})
}

// acceptsGzip reports whether an Accept-Encoding value accepts gzip (a
// member gzip or x-gzip whose q is not 0).
func acceptsGzip(accept string) bool {
	for _, m := range strings.Split(accept, ",") {
		coding, params, _ := strings.Cut(m, ";")
		coding = strings.ToLower(strings.TrimSpace(coding))

		if coding != "gzip" && coding != "x-gzip" {
			continue
		}

		q := strings.TrimSpace(params)
		if v, ok := strings.CutPrefix(q, "q="); ok {
			if f, err := strconv.ParseFloat(v, 64); err == nil && f == 0 {
				continue
			}
		}

		return true
	}

	return false
}

// modelOffset is where the top-level member "model" of a JSON object starts
// (-1: none).
func modelOffset(body []byte) int64 {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return -1
	}

	for dec.More() {
		off := dec.InputOffset()

		k, err := dec.Token()
		if err != nil {
			return -1
		}

		if k == "model" {
			return off + int64(bytes.IndexByte(body[off:], '"'))
		}

		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return -1
		}
	}

	return -1
}
