package tierlimit

import (
	"encoding/json"
	"io"
	"os"
)

// eventWriter is where security events go. Traefik hands the interpreter a
// stderr that writes to its own log, one log line per Write.
var eventWriter io.Writer = os.Stderr

// eventLog writes one JSON line per refusal. De-duplication to one line per
// layer, key and window is the store's (result.firstRefusal), so a flood does
// not flood the log.
type eventLog struct {
	out        io.Writer
	middleware string
}

type rateLimitEvent struct {
	Event      string `json:"event"`
	Severity   string `json:"severity"`
	Limiter    string `json:"limiter"`
	Key        string `json:"key"`
	IP         string `json:"ip"`
	Middleware string `json:"middleware"`
}

func newEventLog(out io.Writer, middleware string) *eventLog {
	return &eventLog{out: out, middleware: middleware}
}

// refused reports that layer refused key for the client at ip.
func (e *eventLog) refused(layer, key, ip string) {
	line, err := json.Marshal(rateLimitEvent{
		Event: "RATE_LIMIT_TRIGGERED", Severity: "warning",
		Limiter: layer, Key: key, IP: ip, Middleware: e.middleware,
	})
	if err != nil {
		return
	}

	_, _ = e.out.Write(append(line, '\n'))
}
