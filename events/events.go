// Package events owns the plugin's event lines, one JSON object per line on
// the Traefik process's stderr (EventWriter): a refusal
// (RATE_LIMIT_TRIGGERED) and an operator's reset (RATE_LIMIT_RESET), written
// by EventLog; the Redis lines' form (RedisEvent), which the Redis store
// writes; and which failures and recoveries of a Redis outage write a line
// (RedisOutage). Which refusal is the first of its window is the stores'
// (rule.Tally.Firsts). It imports nothing of the plugin.
package events

import (
	"encoding/json"
	"io"
	"os"
	"time"
)

// EventWriter is where security and Redis events go: the Traefik process's
// own stderr. Traefik does not route it through its logger, so the lines
// never reach log.filePath; they are collected wherever the process's stderr
// goes (the container runtime, journald, a terminal).
var EventWriter io.Writer = os.Stderr

// eventTimeLayout is RFC 3339 in UTC, to the millisecond: a fixed width, so
// lines sort as text, and events of one burst keep their order.
const eventTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// EventTime formats now (Unix nanoseconds) for an event's "time" field.
func EventTime(now int64) string {
	return time.Unix(0, now).UTC().Format(eventTimeLayout)
}

// EventLog writes one JSON line per refusal (Refused) and per operator's
// reset (Reset). De-duplication to one refusal line per layer, key and window
// is the store's (rule.Tally.Firsts), so a flood does not flood the log.
type EventLog struct {
	out        io.Writer
	middleware string
	Now        func() time.Time // the clock of the lines' "time"; tests set it
}

type rateLimitEvent struct {
	Time       string `json:"time"`
	Event      string `json:"event"`
	Severity   string `json:"severity"`
	Limiter    string `json:"limiter"`
	Key        string `json:"key"`
	IP         string `json:"ip"`
	Middleware string `json:"middleware"`
	// DryRun marks a refusal that a dry-run layer (or the top-level dry
	// run) reports without refusing: the request went through.
	DryRun bool `json:"dryRun,omitempty"`
	// InFlight is a concurrency layer's requests in flight for the key when
	// it refused: all its slots.
	InFlight int64 `json:"inFlight,omitempty"`
}

// NewEventLog returns the EventLog of the middleware named middleware,
// writing to out.
func NewEventLog(out io.Writer, middleware string) *EventLog {
	return &EventLog{out: out, middleware: middleware, Now: time.Now}
}

// Refused reports that layer refused key for the client at ip, or with
// dryRun set, would have.
func (e *EventLog) Refused(layer, key, ip string, dryRun bool) {
	e.RefusedInFlight(layer, key, ip, dryRun, 0)
}

// RefusedInFlight is Refused for a concurrency layer whose key had inFlight
// requests in flight (0: another layer).
func (e *EventLog) RefusedInFlight(layer, key, ip string, dryRun bool, inFlight int64) {
	line, err := json.Marshal(rateLimitEvent{
		Time:  EventTime(e.Now().UnixNano()),
		Event: "RATE_LIMIT_TRIGGERED", Severity: "warning",
		Limiter: layer, Key: key, IP: ip, Middleware: e.middleware, DryRun: dryRun, InFlight: inFlight,
	})
	if err != nil {
		return
	}

	_, _ = e.out.Write(append(line, '\n'))
}

// ResetReport is the reset's answer: what it cleared. Redis is left out with
// the memory store.
type ResetReport struct {
	Error     string `json:"error,omitempty"`
	Layer     string `json:"layer"`
	Key       string `json:"key"`
	Memory    bool   `json:"memory"`
	BlockList bool   `json:"blockList"`
	Redis     string `json:"redis,omitempty"`
}

// resetEvent is the RATE_LIMIT_RESET log line: who reset which key, and what
// that cleared. Limiter names the layer, as in RATE_LIMIT_TRIGGERED.
type resetEvent struct {
	Time       string `json:"time"`
	Event      string `json:"event"`
	Severity   string `json:"severity"`
	Limiter    string `json:"limiter"`
	Key        string `json:"key"`
	Operator   string `json:"operator"`
	Middleware string `json:"middleware"`
	Memory     bool   `json:"memory"`
	BlockList  bool   `json:"blockList"`
	Redis      string `json:"redis,omitempty"`
}

// Reset logs an operator's reset, whatever it cleared.
func (e *EventLog) Reset(r ResetReport, operator string) {
	line, err := json.Marshal(resetEvent{
		Time:  EventTime(e.Now().UnixNano()),
		Event: "RATE_LIMIT_RESET", Severity: "info", Limiter: r.Layer, Key: r.Key, Operator: operator,
		Middleware: e.middleware, Memory: r.Memory, BlockList: r.BlockList, Redis: r.Redis,
	})
	if err != nil {
		return
	}

	_, _ = e.out.Write(append(line, '\n'))
}

// costEvent is the RATE_LIMIT_COST_UNREPORTED line: a response of a costFrom
// route stated no cost, so its request stays charged its reservation.
type costEvent struct {
	Time       string `json:"time"`
	Event      string `json:"event"`
	Severity   string `json:"severity"`
	Limiter    string `json:"limiter"`
	Key        string `json:"key"`
	IP         string `json:"ip"`
	Middleware string `json:"middleware"`
	Source     string `json:"costFrom"`
	Charged    int64  `json:"charged"`
}

// CostUnreported reports that a response of layer's route, for key and the
// client at ip, stated no cost at source: the request stays charged the
// points reserved for it. The caller writes one per layer and window.
func (e *EventLog) CostUnreported(layer, key, ip, source string, charged int64) {
	line, err := json.Marshal(costEvent{
		Time:  EventTime(e.Now().UnixNano()),
		Event: "RATE_LIMIT_COST_UNREPORTED", Severity: "warning", Limiter: layer, Key: key, IP: ip,
		Middleware: e.middleware, Source: source, Charged: charged,
	})
	if err != nil {
		return
	}

	_, _ = e.out.Write(append(line, '\n'))
}
