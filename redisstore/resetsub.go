package redisstore

import (
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
)

// Resets reach every replica. The reset script publishes each reset on its
// keyPrefix's channel, and every Traefik that holds block list entries on a
// Redis backend follows that channel, so that a replica which refused a key
// itself (and so refuses it locally, without Redis) lets it in again as soon
// as the message arrives. One subscription per backend, started with the
// backend's first block list entry: a replica with none has nothing to
// forget, and New does no I/O. While the subscription is down a message is
// lost, and the replica's entry refuses the key until the key's reset at the
// latest (README).

// Subscription timing: a quiet connection is pinged after resetQuiet, and
// given up when the ping is not answered by the next resetQuiet; failures
// are retried after a back-off from resetRetryMin to resetRetryMax.
const (
	resetQuiet    = 5 * time.Second
	resetRetryMin = 50 * time.Millisecond
	resetRetryMax = 5 * time.Second
)

// ResetChannel is the channel of the resets of keyPrefix's middlewares.
func ResetChannel(keyPrefix string) string {
	return keyPrefix + ":resets"
}

// ResetMessage is a reset's message: the middleware's name, the layer's and
// the key, the first two ended by a NUL, which neither holds (blockPrefix).
func ResetMessage(name, layer, key string) string {
	return name + "\x00" + layer + "\x00" + key
}

// parseResetMessage reads a resetMessage; ok is false for any other payload.
func parseResetMessage(payload string) (name, layer, key string, ok bool) {
	i := strings.IndexByte(payload, 0)
	if i <= 0 {
		return "", "", "", false
	}

	rest := payload[i+1:]

	j := strings.IndexByte(rest, 0)
	if j <= 0 || j == len(rest)-1 {
		return "", "", "", false
	}

	return payload[:i], rest[:j], rest[j+1:], true
}

// ResetForget clears a key of a layer in one middleware besides Redis: its
// block list entries and its memory fallback's window (forgetIn).
type ResetForget func(layer, key string)

// resetListener follows the reset channels of one backend on a connection of
// its own, from one goroutine that lives until the backend is released.
//
// Its fields name no type of this package but through func types: Yaegi
// mixes up the types of a struct cycle (redisBackend -> resetListener ->
// redisBackend, or one that reaches windowStore's recursive window), and
// then panics in reflect.Set on the memory store's request path.
type resetListener struct {
	opts     redisresp.Options
	sentinel *redisresp.Sentinel // the backend's, or nil: subscribe on its primary
	cluster  *redisresp.Cluster  // the backend's, or nil: subscribe on one of its nodes
	Event    func(msg string)    // logs that the subscription failed (REDIS_RESETS_UNAVAILABLE)
	back     func()              // logs that it works again (REDIS_RESETS_RECOVERED)

	Mu      sync.Mutex
	Targets map[string]map[string]ResetForget // by channel, then middleware name
	changed bool                              // a channel was added since the last subscription
	running bool
	closed  bool
	Failing bool // the last attempt failed, and was logged
	conn    *redisresp.Conn
	done    chan struct{}
}

// NewResetListener makes b's listener; it does no I/O.
func NewResetListener(b *RedisBackend, opts redisresp.Options) *resetListener {
	event := func(msg string) {
		b.event("REDIS_RESETS_UNAVAILABLE", "error", "", msg, 0, time.Now().UnixNano())
	}
	back := func() {
		b.event("REDIS_RESETS_RECOVERED", "info", "", "", 0, time.Now().UnixNano())
	}

	return &resetListener{opts: opts, sentinel: b.Sentinel, cluster: b.cluster, Event: event, back: back,
		Targets: map[string]map[string]ResetForget{}, done: make(chan struct{})}
}

// ListenResets has s's backend follow s's resets, from s's first block list
// entry on; later calls only refresh the target (a reload's new store).
func ListenResets(s *RedisStore) {
	if r := s.Backend.Resets; r != nil && s.Channel != "" {
		forget := ForgetIn(s.Blocked, s.Local, s.Clock)
		if st := s.Synced; st != nil {
			memory := forget
			forget = func(layer, key string) {
				memory(layer, key)
				SyncForget(st, layer, key)
			}
		}

		r.Listen(s.Channel, s.Name, forget)
	}
}

// ForgetIn clears a key in a middleware's block list and memory fallback,
// at the middleware's clock.
func ForgetIn(blocked *BlockList, local *memstore.WindowStore, clock func() time.Time) ResetForget {
	return func(layer, key string) {
		blocked.forgetLayerKey(layer, key)
		local.ForgetKey(layer, key, clock().UnixNano())
		local.ForgetBlockKey(layer, key)
	}
}

func (r *resetListener) Listen(channel, name string, forget ResetForget) {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	if r.closed {
		return
	}

	m := r.Targets[channel]
	if m == nil {
		m = map[string]ResetForget{}
		r.Targets[channel] = m
		r.changed = true

		// The live connection does not follow the new channel: a new
		// subscription follows them all.
		if r.conn != nil {
			redisresp.Interrupt(r.conn)
		}
	}

	m[name] = forget

	if !r.running {
		r.running = true
		go r.run()
	}
}

// stop ends the goroutine: the backend is released.
func (r *resetListener) stop() {
	if r == nil {
		return
	}

	r.Mu.Lock()
	defer r.Mu.Unlock()

	if r.closed {
		return
	}

	r.closed = true
	close(r.done)

	if r.conn != nil {
		redisresp.Interrupt(r.conn)
	}
}

// resubscribe drops the live connection, so that the goroutine subscribes
// again: a Sentinel named another primary.
func (r *resetListener) resubscribe() {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	if r.conn != nil {
		redisresp.Interrupt(r.conn)
	}
}

// run subscribes and follows until stop, again after each failure.
func (r *resetListener) run() {
	wait := time.Duration(0)

	for attempt := 0; ; attempt++ {
		if wait > 0 && !r.pause(wait) {
			return
		}

		switch {
		case r.Session(attempt):
			wait = resetRetryMin
		case wait < resetRetryMin:
			wait = resetRetryMin
		case wait < resetRetryMax:
			wait *= 2
		}

		if wait > resetRetryMax {
			wait = resetRetryMax
		}
	}
}

// pause waits d, and reports false once stopped.
func (r *resetListener) pause(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()

	select {
	case <-r.done:
		return false
	case <-t.C:
		return true
	}
}

// Session subscribes once and follows the connection until it fails, and
// reports whether it subscribed. A panic ends the session, not Traefik.
func (r *resetListener) Session(attempt int) (subscribed bool) {
	defer func() {
		if recover() != nil {
			subscribed = false
		}
	}()

	opts, err := r.address(attempt)

	var c *redisresp.Conn
	if err == nil {
		c, err = redisresp.Subscribe(opts, r.channels())
	}

	if err != nil {
		r.failed(err)
		return false
	}

	if !r.attach(c) {
		_ = c.Close()
		return true
	}

	defer r.detach(c)

	r.follow(c, opts.Address)

	return true
}

var errNoPrimaryYet = errors.New("no primary known yet")

// address is the server to subscribe on: the single server, a Sentinel's
// current primary, or one of a cluster's nodes, a next one at each attempt.
func (r *resetListener) address(attempt int) (redisresp.Options, error) {
	opts := r.opts

	switch {
	case r.sentinel != nil:
		opts.Sentinel = nil
		opts.RequirePrimary = true
		opts.Address = r.sentinel.Primary()

		if opts.Address == "" {
			return opts, errNoPrimaryYet
		}
	case r.cluster != nil:
		opts.Cluster = nil
		nodes := redisresp.ClusterNodes(r.cluster)

		if len(nodes) == 0 {
			return opts, redisresp.ErrCluster
		}

		opts.Address = nodes[attempt%len(nodes)]
	}

	return opts, nil
}

// channels lists the channels to subscribe to.
func (r *resetListener) channels() []string {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	r.changed = false

	out := make([]string, 0, len(r.Targets))
	for ch := range r.Targets {
		out = append(out, ch)
	}

	return out
}

// attach makes c the live connection, unless the listener stopped or a
// channel was added since the subscription (then the caller subscribes
// again). The first subscription after a failure that was logged logs that
// resets arrive again: one REDIS_RESETS_RECOVERED per
// REDIS_RESETS_UNAVAILABLE, both written under the lock that orders them.
func (r *resetListener) attach(c *redisresp.Conn) bool {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	if r.closed || r.changed {
		return false
	}

	r.conn = c

	if r.Failing && r.back != nil {
		r.back()
	}

	r.Failing = false

	return true
}

func (r *resetListener) detach(c *redisresp.Conn) {
	r.Mu.Lock()
	r.conn = nil
	r.Mu.Unlock()

	_ = c.Close()
}

// follow dispatches c's messages until c fails, a ping goes unanswered, or a
// Sentinel's primary is no longer addr.
func (r *resetListener) follow(c *redisresp.Conn, addr string) {
	pinged := false

	for {
		m, err := redisresp.ReceiveMessage(c, time.Now().Add(resetQuiet))

		switch {
		case errors.Is(err, redisresp.ErrQuiet):
			if pinged || r.moved(addr) || redisresp.Ping(c, time.Now().Add(resetQuiet)) != nil {
				return
			}

			pinged = true
		case err != nil:
			return
		default:
			pinged = false

			if m.Channel != "" {
				r.Dispatch(m)
			}
		}
	}
}

// moved reports whether the Sentinel's primary is another server than addr.
func (r *resetListener) moved(addr string) bool {
	return r.sentinel != nil && r.sentinel.Primary() != addr
}

// Dispatch clears what the reset m names in the middleware it names; a
// payload that is not a reset, or names a middleware that does not listen
// on m's channel, is dropped.
func (r *resetListener) Dispatch(m redisresp.Message) {
	name, layer, key, ok := parseResetMessage(m.Payload)
	if !ok {
		return
	}

	r.Mu.Lock()
	forget := r.Targets[m.Channel][name]
	r.Mu.Unlock()

	if forget != nil {
		forget(layer, key)
	}
}

// failed logs the first failure of a row: later ones are the same outage.
func (r *resetListener) failed(err error) {
	r.Mu.Lock()
	defer r.Mu.Unlock()

	if !r.Failing && !r.closed {
		r.Event(err.Error())
	}

	r.Failing = true
}

// forgetLayerKey drops key's entries of the layer named layer, under any of
// the limits that layer had (blockPrefix), and reports whether there was one.
func (b *BlockList) forgetLayerKey(layer, key string) bool {
	head := layer + "\x00"

	b.Mu.Lock()
	defer b.Mu.Unlock()

	found := false

	for prefix := range b.prefixes {
		if !strings.HasPrefix(prefix, head) {
			continue
		}

		if _, ok := b.Until[prefix+key]; ok {
			delete(b.Until, prefix+key)
			found = true
		}
	}

	b.Size.Store(int64(len(b.Until)))

	return found
}
