package redisstore

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/redisresp"
)

// Back-off bounds: Redis is skipped for minBackoff after a failure, doubling
// while probes keep failing, up to maxBackoff.
const (
	MinBackoff = 200 * time.Millisecond
	maxBackoff = 5 * time.Second
)

// RedisBackend is one Redis deployment as every middleware configured for it
// shares it: the client (a pool, or the Sentinel-found primary's) and whether
// Redis is usable now.
type RedisBackend struct {
	Pool     redisresp.Client
	cluster  *redisresp.Cluster  // pool as a cluster client, or nil
	Single   *redisresp.Pool     // pool as one server's pool, or nil (redisPath)
	Sentinel *redisresp.Sentinel // pool as a Sentinel's primary, or nil (redisPath)
	Address  string
	Log      io.Writer
	Resets   *resetListener // follows the resets of the backend's middlewares (resetsub.go)

	// down mirrors failing for the common path, which then takes no lock.
	Down atomic.Bool

	Mu       sync.Mutex
	failing  bool
	probing  bool  // one request is trying Redis after the back-off
	retryAt  int64 // Unix nanoseconds
	Backoff  time.Duration
	outage   events.RedisOutage // which transitions are logged (../events/redisevents.go)
	reason   string             // why the last failure failed, while failing (reason.go)
	probeKey string             // the key the probe writes (probe.go)
	debts    []func()           // what the stores' fallbacks charged, paid when Redis answers again (owed.go)
	Probe    redisProbe         // the goroutine that probes Redis while failing (probe.go)
}

// Usable reports whether to call Redis at now. While failing, one request per
// back-off period is let through as a probe.
func (b *RedisBackend) Usable(now int64) (use, probe bool) {
	if !b.Down.Load() {
		return true, false
	}

	b.Mu.Lock()
	defer b.Mu.Unlock()

	if !b.failing {
		return true, false
	}

	if b.probing || now < b.retryAt {
		return false, false
	}

	b.probing = true

	return true, true
}

// UseNow reports whether a request calls Redis at now while b is down
// (Usable): not during the back-off; after it, one request is the probe,
// which first writes to Redis as a request would (ProbeWrite) and calls it
// only once that succeeded, the outage then over. A request's own call is
// no probe: one that writes nothing (a refusal, a layer that only checks)
// would be answered by a replica or a server out of memory too, with counts
// the fallback must not take for Redis's.
func UseNow(b *RedisBackend, now int64) bool {
	use, probe := b.Usable(now)
	if !probe {
		return use
	}

	return b.ProbeWrite(now)
}

// ProbeWrite is the back-off's probe, started at now, that Usable granted:
// the probe's write (writeProbe), then Succeeded or Failed. It reports
// whether Redis took the write.
func (b *RedisBackend) ProbeWrite(now int64) bool {
	err := writeProbe(b)
	if err == nil {
		b.Succeeded(now)
		return true
	}

	// Not Redis failing (Take): the probe is given back.
	if errors.Is(err, redisresp.ErrClosed) || errors.Is(err, redisresp.ErrPoolTimeout) {
		b.Mu.Lock()
		b.probing = false
		b.Mu.Unlock()

		return false
	}

	b.Failed(now, true, err)

	return false
}

// Succeeded records the back-off's probe, started at now, succeeding. Leaving
// the fallback (down, the metric) and REDIS_RECOVERED are one transition.
func (b *RedisBackend) Succeeded(now int64) {
	b.Mu.Lock()

	// The line is written before the fallback ends, under the lock that
	// orders the transitions, so that whoever sees the metric at 0 finds it.
	if b.failing {
		b.event("REDIS_RECOVERED", "info", "", "", 0, now)
	}

	events.OutageSucceeded(&b.outage, now, true)
	b.failing, b.probing, b.Backoff = false, false, 0
	b.reason = ""
	b.Down.Store(false)
	debts := b.debts
	b.debts = nil
	b.Mu.Unlock()

	if debts != nil {
		go payDebts(debts)
	}
}

// Failed records a failed call. The first failure starts the back-off; a failed
// probe doubles it. Failures of calls that were in flight when Redis went away
// change nothing, so a burst of them does not inflate the back-off, and a
// call that started before the last outage ended changes nothing either.
func (b *RedisBackend) Failed(now int64, probe bool, err error) {
	b.Mu.Lock()

	kind := events.OutageFailed(&b.outage, now, probe)
	if kind == outageStale {
		b.Mu.Unlock()
		return
	}

	first := !b.failing
	if !first && !probe {
		b.Mu.Unlock()
		return
	}

	backoff := MinBackoff
	if !first {
		backoff = b.Backoff * 2
		if backoff > maxBackoff {
			backoff = maxBackoff
		}
	}

	b.reason = Reason(err)

	// As in succeeded: the line before the metric moves, under the lock
	// that orders the transitions.
	if kind != outageQuiet {
		b.event("REDIS_UNAVAILABLE", "error", b.reason, err.Error(), backoff, now)
	}

	b.failing, b.probing, b.Backoff = true, false, backoff
	b.Down.Store(true)
	b.retryAt = now + int64(backoff)
	start := scheduleProbe(b, now)
	b.Mu.Unlock()

	if start {
		go probeRedis(b)
	}
}

// FallbackReason is why Redis is failing (Reason), or "" while it is not.
func FallbackReason(b *RedisBackend) string {
	b.Mu.Lock()
	defer b.Mu.Unlock()

	if !b.failing {
		return ""
	}

	return b.reason
}

// switched logs that the sentinels named another primary, and lets the next
// request probe it at once when Redis was failing: the back-off waited for
// exactly this.
func (b *RedisBackend) switched(from, to string) {
	b.Mu.Lock()
	b.retryAt = 0
	b.Mu.Unlock()

	if b.Resets != nil {
		b.Resets.resubscribe()
	}

	line, err := events.RedisEventLine(events.RedisEvent{Event: "REDIS_PRIMARY_CHANGED", Severity: "info", Address: b.Address, Primary: to, Previous: from}, time.Now().UnixNano())
	if err == nil {
		_, _ = b.Log.Write(line)
	}
}

func (b *RedisBackend) event(name, severity, reason, msg string, retry time.Duration, now int64) {
	ev := events.RedisEvent{Event: name, Severity: severity, Address: b.Address, Reason: reason, Error: msg}
	if sp, ok := b.Pool.(interface{ Primary() string }); ok {
		ev.Primary = sp.Primary()
	}
	if retry > 0 {
		ev.Fallback = "memory"
		ev.RetryIn = retry.String()
	}

	line, err := events.RedisEventLine(ev, now)
	if err != nil {
		return
	}

	_, _ = b.Log.Write(line)
}

// Backends shares one redisBackend per distinct Redis configuration across
// middlewares, routers and reloads, so reloads do not open new pools. A
// backend no instance uses any more is released (../lifetime/lifetime.go) and its pool
// closed: idle connections at once, busy ones when their call returns.
var Backends = &BackendRegistry{ByConfig: lifetime.NewHeldRegistry(CloseBackend)}

type BackendRegistry struct {
	ByConfig *lifetime.HeldRegistry // *redisBackend by configuration
}

func CloseBackend(v interface{}) {
	if b, ok := v.(*RedisBackend); ok {
		StopProbe(b)
		flushSyncsOn(b) // released at the same grace, in either order
		b.Resets.stop()
		b.Pool.Close()
	}
}

// Get returns the backend of opts, held until ctx is cancelled.
func (r *BackendRegistry) Get(ctx context.Context, opts redisresp.Options) *RedisBackend {
	id := opts.Key()

	v := r.ByConfig.Take(ctx, id, func() interface{} {
		return NewBackend(opts)
	})

	b, _ := v.(*RedisBackend)

	return b
}

// NewBackend makes the client opts describe: a pool, a Sentinel's primary
// (whose switches it logs) or a cluster.
func NewBackend(opts redisresp.Options) *RedisBackend {
	b := &RedisBackend{Pool: redisresp.NewClient(opts), Address: opts.Target(), Log: events.EventWriter}
	b.Probe.Done = make(chan struct{})
	if sc, ok := b.Pool.(*redisresp.Sentinel); ok {
		sc.OnSwitch = b.switched
		b.Sentinel = sc
	}

	b.cluster, _ = b.Pool.(*redisresp.Cluster)
	b.Single, _ = b.Pool.(*redisresp.Pool)
	b.Resets = NewResetListener(b, opts)

	return b
}

// ClusterOf is b's cluster client, or nil when b is one server or a
// Sentinel's primary.
func ClusterOf(b *RedisBackend) *redisresp.Cluster {
	return b.cluster
}
