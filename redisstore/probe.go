package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// While a backend is failing, a goroutine of its own probes Redis on the
// back-off's schedule, so that a replica that receives no request needing
// Redis still sees it answer again: the backend leaves the fallback
// (tierlimit_redis_fallback 0), REDIS_RECOVERED is written and what the
// outage owes is paid (owed.go), all through redisBackend.succeeded, as when
// a request's probe succeeds. The goroutine starts with the backend's first
// failure (never in New), ends when Redis answers or the backend is released
// (closeBackend), and recovers from panics. Requests still probe too: the
// first of the two to find Redis up ends the outage, and only one probe runs
// at a time (redisBackend.probing).

// minProbeWait is the shortest pause between two looks at the back-off: a
// request's probe under way, or a clock that says the back-off ended, is
// looked at again after it rather than in a busy loop.
const minProbeWait = 20 * time.Millisecond

// redisProbe is the probing goroutine's state, under the backend's mutex.
// Times of the back-off are the calls' (Unix nanoseconds, from the clock of
// the instance that failed); the goroutine waits in real time from the last
// failure, and times its probe as that failure plus the time since.
type redisProbe struct {
	Done       chan struct{} // closed when the backend is released; nil: no goroutine (a test's backend)
	closed     bool
	Running    bool
	failedAt   int64     // the last failure that set the back-off, on the calls' clock
	failedWall time.Time // when it was recorded
}

// scheduleProbe records a failure at now that set the back-off, and reports
// whether the probing goroutine is to be started. Called with b.mu held.
func scheduleProbe(b *RedisBackend, now int64) bool {
	p := &b.Probe
	p.failedAt = now
	p.failedWall = time.Now()

	if p.Done == nil || p.closed || p.Running {
		return false
	}

	p.Running = true

	return true
}

// StopProbe ends the probing goroutine: the backend is released.
func StopProbe(b *RedisBackend) {
	b.Mu.Lock()
	defer b.Mu.Unlock()

	if b.Probe.Done != nil && !b.Probe.closed {
		b.Probe.closed = true
		close(b.Probe.Done)
	}
}

// probeRedis probes b until Redis answers or b is released.
func probeRedis(b *RedisBackend) {
	claimed := false

	// A panic ends the goroutine, not Traefik; a probe it left claimed is
	// given back, so that requests probe again (and the next failure starts
	// another goroutine).
	defer func() {
		_ = recover()

		b.Mu.Lock()
		b.Probe.Running = false
		if claimed {
			b.probing = false
		}
		b.Mu.Unlock()
	}()

	for {
		wait, ok := probeWait(b)
		if !ok || !pauseProbe(b, wait) {
			return
		}

		now, ok := claimProbe(b)
		if !ok {
			continue
		}

		claimed = true
		err := writeProbe(b)

		if errors.Is(err, redisresp.ErrClosed) {
			return
		}

		claimed = false

		if err == nil {
			b.Succeeded(now)
		} else {
			b.Failed(now, true, err)
		}
	}
}

// probeWait is how long to wait before the next probe, and false once there
// is nothing to probe: Redis answered, or the backend was released. Then the
// goroutine is marked stopped under the same lock, so that the next failure
// starts another.
func probeWait(b *RedisBackend) (time.Duration, bool) {
	b.Mu.Lock()
	defer b.Mu.Unlock()

	p := &b.Probe
	if p.closed || !b.failing {
		p.Running = false
		return 0, false
	}

	wait := b.Backoff - time.Since(p.failedWall)
	if wait < minProbeWait {
		wait = minProbeWait
	}

	return wait, true
}

// pauseProbe waits d, and reports false once the backend is released.
func pauseProbe(b *RedisBackend, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-b.Probe.Done:
		return false
	case <-t.C:
		return true
	}
}

// claimProbe makes the goroutine the back-off's probe, unless Redis answered
// or a request is probing, and returns the probe's time on the calls' clock.
func claimProbe(b *RedisBackend) (int64, bool) {
	b.Mu.Lock()
	defer b.Mu.Unlock()

	p := &b.Probe
	if !b.failing || b.probing || time.Since(p.failedWall) < b.Backoff {
		return 0, false
	}

	b.probing = true

	return p.failedAt + int64(time.Since(p.failedWall)), true
}

// writeProbe asks Redis what a request would: the rate-limit script charges
// one point to a fixed window of its own (ProbeKey, probeWindow long, of
// probePoints), through the call requests make, which the ACL grants; it
// loads the script into a server that restarted empty. A server that
// answers but refuses writes (a replica, out of memory, a failed save) fails
// it, as it fails requests. It runs on a new connection (dropIdle). On a
// cluster it goes to the key's node, after the cluster's own check of the
// nodes it saw fail.
func writeProbe(b *RedisBackend) error {
	dropIdle(b)

	key := ProbeKeyOf(b)
	call := takeCall(1)
	arg := redisresp.Bulk(key) + ArgStopAtRefusal + argCostOne + probeArgs

	var ints []int64
	var serverErr string
	var err error

	if b.cluster != nil {
		replies, cerr := b.cluster.RunInts([]redisresp.ClusterCall{{Slot: redisresp.Slot(key), Call: call, Encoded: arg}})
		err = cerr
		if err == nil && len(replies) == 1 {
			ints = replies[0].Ints
			serverErr = replies[0].ServerErr
		}
	} else {
		ints, serverErr, err = call.RunIntsOn(b.Pool, arg)
	}

	switch {
	case err != nil:
		return err
	case serverErr != "":
		return fmt.Errorf("probing Redis with a write: %w: %s", redisresp.ErrServer, serverErr)
	case len(ints) != 2 || ints[0] < 1:
		return fmt.Errorf("probing Redis with a write: %w: %v", ErrBadReply, ints)
	}

	return nil
}

// dropIdle closes b's idle connections before a probe: those that an outage
// left (a restarted server, a network cut) are dead, and the probe would
// fail on each in turn, one back-off each, after Redis came back.
func dropIdle(b *RedisBackend) {
	switch {
	case b.Single != nil:
		b.Single.DropIdle()
	case b.Sentinel != nil:
		b.Sentinel.DropIdle()
	case b.cluster != nil:
		b.cluster.DropIdle()
	}
}

// The probe's window: short, so that its key goes with the outage, and of
// points no probing reaches.
const (
	probeWindow = time.Second
	probePoints = 1 << 40
)

var probeArgs = redisresp.Bulk(strconv.FormatInt(probePoints, 10)) +
	redisresp.Bulk(strconv.FormatInt(int64(probeWindow/time.Millisecond), 10)) + algoFixed + redisresp.Bulk("0")

// DefaultProbeKey is the probe's key until a store names the backend's
// (SetProbeKey): under the default keyPrefix.
const DefaultProbeKey = "ratelimit:probe"

// ProbeKey returns the probe's key for keyPrefix: under it, so that the ACL
// that grants the plugin's keys grants it; no middleware's key is
// <keyPrefix>:probe (theirs are <keyPrefix>:<name>:<layer>:<key>).
func ProbeKey(keyPrefix string) string {
	return keyPrefix + ":probe"
}

// SetProbeKey makes key b's probe key: the latest store made on b names it.
func SetProbeKey(b *RedisBackend, key string) {
	b.Mu.Lock()
	b.probeKey = key
	b.Mu.Unlock()
}

// ProbeKeyOf is b's probe key.
func ProbeKeyOf(b *RedisBackend) string {
	b.Mu.Lock()
	defer b.Mu.Unlock()

	if b.probeKey == "" {
		return DefaultProbeKey
	}

	return b.probeKey
}
