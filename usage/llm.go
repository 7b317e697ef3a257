package usage

import (
	"bytes"
	"encoding/json"
)

// The llm: variables read the usage that each of these APIs states, in a
// JSON body or in the events of a stream (docs/limits.md has the table):
//
//   - OpenAI Chat Completions: usage.prompt_tokens, completion_tokens and
//     prompt_tokens_details.cached_tokens; in a stream, the last chunk's
//     (stream_options.include_usage), the others' usage being null.
//   - OpenAI Responses: usage.input_tokens, output_tokens and
//     input_tokens_details.cached_tokens; in a stream, response.usage of
//     response.completed (or response.incomplete...).
//   - Anthropic Messages: usage.input_tokens, output_tokens,
//     cache_read_input_tokens and cache_creation_input_tokens; in a stream,
//     message_start's message.usage and message_delta's usage (cumulative).
//   - Gemini generateContent and streamGenerateContent: usageMetadata's
//     promptTokenCount, candidatesTokenCount, thoughtsTokenCount,
//     cachedContentTokenCount and toolUsePromptTokenCount, each chunk's
//     cumulative.
//
// Each field keeps the value of the last object that states it. A response
// is one API's, so a variable adds up the fields of all four: input is
// every input token, cached ones included (OpenAI's and Gemini's prompt
// counts include them, Anthropic's input_tokens does not); output every
// output token, reasoning included (Gemini states its thoughts apart);
// cachedInput the input tokens read from a cache; total input plus output.

// The llm: fields (Reader.fields).
const (
	fPromptTokens = iota
	fCompletionTokens
	fPromptCached
	fInputTokens
	fOutputTokens
	fInputCached
	fCacheRead
	fCacheCreation
	fPromptCount
	fCandidates
	fThoughts
	fCachedContent
	fToolUsePrompt
	nFields
)

// usageFields are the members of a usage object that hold a field;
// usageDetails those that hold an object whose cached_tokens does.
var (
	usageFields = map[string]int{
		"prompt_tokens": fPromptTokens, "completion_tokens": fCompletionTokens,
		"input_tokens": fInputTokens, "output_tokens": fOutputTokens,
		"cache_read_input_tokens": fCacheRead, "cache_creation_input_tokens": fCacheCreation,
		"promptTokenCount": fPromptCount, "candidatesTokenCount": fCandidates, "thoughtsTokenCount": fThoughts,
		"cachedContentTokenCount": fCachedContent, "toolUsePromptTokenCount": fToolUsePrompt,
	}
	usageDetails = map[string]int{"prompt_tokens_details": fPromptCached, "input_tokens_details": fInputCached}
	// usageOwners are the members whose object holds a usage object: an
	// Anthropic stream's message_start, an OpenAI Responses stream's events.
	usageOwners = []string{"message", "response"}
)

// The fields each variable adds up.
var (
	inputFields  = []int{fPromptTokens, fInputTokens, fCacheRead, fCacheCreation, fPromptCount, fToolUsePrompt}
	outputFields = []int{fCompletionTokens, fOutputTokens, fCandidates, fThoughts}
	cachedFields = []int{fPromptCached, fInputCached, fCacheRead, fCachedContent}
)

// maxField bounds a field's value, so that a variable's sum cannot overflow.
const maxField = int64(1) << 50

// usageOfObject reads the usage objects of the JSON object raw: usage,
// usageMetadata, message.usage and response.usage.
func usageOfObject(r *Reader, raw []byte) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return
	}

	readUsageObject(r, m["usage"])
	readUsageObject(r, m["usageMetadata"])

	for _, outer := range usageOwners {
		if v := m[outer]; v != nil {
			var o map[string]json.RawMessage
			if json.Unmarshal(v, &o) == nil {
				readUsageObject(r, o["usage"])
			}
		}
	}
}

// readUsageObject reads the fields of a usage object (null or absent: none).
func readUsageObject(r *Reader, raw json.RawMessage) {
	if raw == nil {
		return
	}

	var u map[string]json.RawMessage
	if json.Unmarshal(raw, &u) != nil {
		return
	}

	for name, v := range u {
		if f, ok := usageFields[name]; ok {
			setField(r, f, v)
			continue
		}

		if f, ok := usageDetails[name]; ok {
			var d map[string]json.RawMessage
			if json.Unmarshal(v, &d) == nil {
				setField(r, f, d["cached_tokens"])
			}
		}
	}
}

// setField keeps field f's value raw, when it is a count (ParseHeaderValue).
func setField(r *Reader, f int, raw json.RawMessage) {
	if raw == nil {
		return
	}

	n, ok := ParseHeaderValue(string(bytes.TrimSpace(raw)))
	if !ok {
		return
	}

	if n > maxField {
		n = maxField
	}

	r.fields[f] = n
	r.set |= uint32(1) << uint(f)
}

// llmValue is the value of the llm: variable v in what r has read.
func llmValue(r *Reader, v int) int64 {
	switch v {
	case llmInput:
		return sumFields(r, inputFields)
	case llmOutput:
		return sumFields(r, outputFields)
	case llmCachedInput:
		return sumFields(r, cachedFields)
	}

	return sumFields(r, inputFields) + sumFields(r, outputFields)
}

func sumFields(r *Reader, fields []int) int64 {
	n := int64(0)

	for _, f := range fields {
		n += r.fields[f]
	}

	return n
}
