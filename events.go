package tierlimit

import (
	"encoding/json"
	"io"
	"os"
	"time"
)

// eventWriter is where security and Redis events go: the Traefik process's
// own stderr. Traefik does not route it through its logger, so the lines
// never reach log.filePath; they are collected wherever the process's stderr
// goes (the container runtime, journald, a terminal).
var eventWriter io.Writer = os.Stderr

// eventTimeLayout is RFC 3339 in UTC, to the millisecond: a fixed width, so
// lines sort as text, and events of one burst keep their order.
const eventTimeLayout = "2006-01-02T15:04:05.000Z07:00"

// eventTime formats now (Unix nanoseconds) for an event's "time" field.
func eventTime(now int64) string {
	return time.Unix(0, now).UTC().Format(eventTimeLayout)
}

// eventLog writes one JSON line per refusal. De-duplication to one line per
// layer, key and window is the store's (result.firstRefusal), so a flood does
// not flood the log.
type eventLog struct {
	out        io.Writer
	middleware string
	now        func() time.Time // the clock of the lines' "time"; tests set it
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
}

func newEventLog(out io.Writer, middleware string) *eventLog {
	return &eventLog{out: out, middleware: middleware, now: time.Now}
}

// refused reports that layer refused key for the client at ip, or with
// dryRun set, would have.
func (e *eventLog) refused(layer, key, ip string, dryRun bool) {
	line, err := json.Marshal(rateLimitEvent{
		Time:  eventTime(e.now().UnixNano()),
		Event: "RATE_LIMIT_TRIGGERED", Severity: "warning",
		Limiter: layer, Key: key, IP: ip, Middleware: e.middleware, DryRun: dryRun,
	})
	if err != nil {
		return
	}

	_, _ = e.out.Write(append(line, '\n'))
}
