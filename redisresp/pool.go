package redisresp

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configure a Pool. Zero durations and sizes take the defaults noted.
type Options struct {
	Address     string        // host:port
	Username    string        // ACL user; empty for the default user
	Password    string        // AUTH is sent when set
	DB          int           // SELECT is sent when not 0
	TLS         bool          // TLS: with TLSConfig when set, else the system roots and Address's host
	TLSConfig   TLSOptions    // CA, client certificate and server name, used when TLS is set
	DialTimeout time.Duration // connect, TLS and AUTH/SELECT; default 250ms
	Timeout     time.Duration // each call, from taking a connection to the last reply; default 100ms
	PoolSize    int           // connections open at most; default 16
	// WaitTimeout bounds the wait for a connection when all PoolSize are in
	// use; default DefaultWaitTimeout. Separate from Timeout: a busy pool is
	// not a slow server, and a burst queues for longer than one call lasts.
	WaitTimeout time.Duration
	Limits      Limits // zero fields take DefaultLimits' values

	// RequirePrimary checks every new connection with ROLE and refuses one to
	// a replica (ErrNotPrimary): an address learnt from sentinels may be stale.
	RequirePrimary bool
	// Sentinel, when set, makes NewClient find the primary through sentinels;
	// Address is then ignored.
	Sentinel *SentinelOptions
	// Cluster, when set, makes NewClient a Redis Cluster client; Address is
	// then ignored.
	Cluster *ClusterOptions
}

// Key identifies the deployment and settings, so that clients can be shared
// by everything configured alike.
func (o Options) Key() string {
	parts := []string{o.Address, o.Username, o.Password, strconv.Itoa(o.DB), strconv.FormatBool(o.TLS),
		o.TLSConfig.CA, o.TLSConfig.Cert, o.TLSConfig.Key, o.TLSConfig.ServerName, strconv.FormatBool(o.TLSConfig.InsecureSkipVerify),
		o.DialTimeout.String(), o.Timeout.String(), strconv.Itoa(o.PoolSize), strconv.FormatBool(o.RequirePrimary), o.WaitTimeout.String()}

	if s := o.Sentinel; s != nil {
		parts = append(parts, "sentinel", s.MasterName, s.Username, s.Password)
		parts = append(parts, s.Addresses...)
	}

	if c := o.Cluster; c != nil {
		parts = append(parts, "cluster")
		parts = append(parts, c.Addresses...)
	}

	return strings.Join(parts, "\x00")
}

// Target names the deployment in log lines: the address, or the sentinels'
// master name and addresses.
func (o Options) Target() string {
	if s := o.Sentinel; s != nil {
		return "sentinel:" + s.MasterName + "@" + strings.Join(s.Addresses, ",")
	}

	if c := o.Cluster; c != nil {
		return "cluster:" + strings.Join(c.Addresses, ",")
	}

	return o.Address
}

// Client runs encoded commands against a deployment: a Pool for one server,
// a Sentinel for the primary of a monitored group.
type Client interface {
	// DoInts runs one encoded command whose reply is an array of integers.
	DoInts(cmd string) ([]int64, string, error)
	// Close closes the client's connections.
	Close()
}

// NewClient returns the client that opts describe; it does no I/O.
func NewClient(opts Options) Client {
	if opts.Sentinel != nil {
		return NewSentinel(opts)
	}

	if opts.Cluster != nil {
		return NewCluster(opts)
	}

	return NewPool(opts)
}

// DefaultWaitTimeout is how long a call waits for a free connection when
// every one is in use. It is generous because a busy pool is not an outage:
// a burst of requests queues behind PoolSize calls, each bounded by Timeout,
// and a caller that gave up would be decided without Redis. A server that
// stops answering still fails fast: its calls time out, and a failed dial
// ends every wait at once (release).
const DefaultWaitTimeout = 5 * time.Second

// Pool is a bounded pool of connections. New connections are dialled on
// demand, never by NewPool. Safe for concurrent use.
//
// The bookkeeping is a mutex and slices rather than channels: under Yaegi a
// select costs more than the Redis round trip. Only a caller that finds all
// PoolSize connections in use gets a channel, in a queue served oldest first:
// a returned connection is handed to the oldest waiter directly, so a burst
// is served in order and a newcomer never takes a connection from a caller
// that has waited longer.
type Pool struct {
	opts Options

	mu      sync.Mutex
	idle    []*Conn      // connections ready for use; empty while anyone waits
	open    int          // connections open or being dialled, PoolSize at most
	queue   []chan grant // callers waiting for a connection, oldest first
	waiting int          // len(queue), for the request path's one comparison
	closed  bool
}

// grant ends a caller's wait: a connection, a slot to dial one (dial), or
// the error that ends every wait (a failed dial, the pool closed).
type grant struct {
	c    *Conn
	dial bool
	err  error
}

// NewPool returns a pool; it does no I/O.
func NewPool(opts Options) *Pool {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 250 * time.Millisecond
	}

	if opts.Timeout <= 0 {
		opts.Timeout = 100 * time.Millisecond
	}

	if opts.PoolSize <= 0 {
		opts.PoolSize = 16
	}

	if opts.Limits.MaxLine <= 0 {
		opts.Limits.MaxLine = DefaultLimits.MaxLine
	}

	if opts.Limits.MaxBulk <= 0 {
		opts.Limits.MaxBulk = DefaultLimits.MaxBulk
	}

	if opts.Limits.MaxElements <= 0 {
		opts.Limits.MaxElements = DefaultLimits.MaxElements
	}

	if opts.Limits.MaxDepth <= 0 {
		opts.Limits.MaxDepth = DefaultLimits.MaxDepth
	}

	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = DefaultWaitTimeout
	}

	return &Pool{opts: opts}
}

// Do runs one command within Options.Timeout (plus DialTimeout when it has to
// open a connection). A server error reply is returned as a value.
func (p *Pool) Do(args ...string) (Value, error) {
	replies, err := p.Pipeline([][]string{args})
	if err != nil {
		return Value{}, err
	}

	return replies[0], nil
}

// DoInts runs one encoded command whose reply is an array of integers; a
// server error comes back as its text (see Conn.DoInts).
//
// It takes and returns an idle connection inline, as reserve and put would:
// it is the call the rate limiter makes on every request (tierlimit's
// doc.go: frames).
func (p *Pool) DoInts(cmd string) ([]int64, string, error) {
	var c *Conn

	p.mu.Lock()

	if n := len(p.idle); n > 0 && !p.closed {
		c = p.idle[n-1]
		p.idle = p.idle[:n-1]
	}

	p.mu.Unlock()

	if c == nil {
		var err error
		if c, err = p.get(); err != nil {
			return nil, "", err
		}
	}

	ints, serverErr, err := c.DoInts(time.Now().Add(p.opts.Timeout), cmd)

	p.mu.Lock()

	if c.err == nil && !p.closed && p.waiting == 0 {
		p.idle = append(p.idle, c)
		p.mu.Unlock()

		return ints, serverErr, err
	}

	p.mu.Unlock()
	p.put(c)

	return ints, serverErr, err
}

// ScriptInts runs a script call on p or, when p is nil, on the primary s
// follows (SentinelScriptInts); cmd is call.Head() followed by the encoded
// keys and arguments (see Call.RunInts). It returns an integer reply as n,
// with ints nil (a negative one is ErrUnexpected), and the integers of an
// array reply as ints, with n -1; a server error reply is an error wrapping
// ErrServer. It is Call.RunInts for the rate limiter's fast path: an idle
// connection is taken, used and returned inline, and the reply read by
// connInts; every other case (no idle connection, NOSCRIPT, an error) is
// finished by scriptSlow. A function, not a method of Pool, as connInts:
// under Yaegi a method call costs a reflect.MakeFunc round trip (tierlimit's
// doc.go: frames, functions).
func ScriptInts(p *Pool, s *Sentinel, call Call, cmd string) (int64, []int64, error) {
	if p == nil {
		return SentinelScriptInts(s, call, cmd)
	}

	var c *Conn

	p.mu.Lock()

	if n := len(p.idle); n > 0 && !p.closed {
		c = p.idle[n-1]
		p.idle = p.idle[:n-1]
	}

	p.mu.Unlock()

	n := int64(-1)
	var ints []int64
	if c != nil {
		n, ints = connInts(c, time.Now().Add(p.opts.Timeout), cmd)
	}

	if n < 0 && ints == nil {
		return p.scriptSlow(c, call, cmd)
	}

	p.mu.Lock()

	if !p.closed && p.waiting == 0 {
		p.idle = append(p.idle, c)
		p.mu.Unlock()

		return n, ints, nil
	}

	p.mu.Unlock()
	p.put(c)

	return n, ints, nil
}

// scriptSlow finishes Script when no connection was idle (c is nil), or c
// answered cmd with something else than integers: it takes a connection as
// get does, and loads the script with EVAL on NOSCRIPT.
func (p *Pool) scriptSlow(c *Conn, call Call, cmd string) (int64, []int64, error) {
	if c == nil {
		var err error
		if c, err = p.get(); err != nil {
			return -1, nil, err
		}

		if n, ints := connInts(c, time.Now().Add(p.opts.Timeout), cmd); n >= 0 || ints != nil {
			p.put(c)
			return n, ints, nil
		}
	}

	err := c.err
	serverErr := c.serverErr
	c.serverErr = ""

	if err == nil && strings.HasPrefix(serverErr, "NOSCRIPT") {
		if n, ints := connInts(c, time.Now().Add(p.opts.Timeout), call.eval+cmd[len(call.evalsha):]); n >= 0 || ints != nil {
			p.put(c)
			return n, ints, nil
		}

		err = c.err
		serverErr = c.serverErr
		c.serverErr = ""
	}

	p.put(c)

	if err != nil {
		return -1, nil, err
	}

	return -1, nil, fmt.Errorf("%w: %s", ErrServer, serverErr)
}

// DropIdle closes p's idle connections. After a failure they may all be
// dead (a restarted server, a network cut), and each would fail a call in
// turn: the rate limiter's probe of a failing Redis starts from a new one.
func (p *Pool) DropIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.open -= len(idle)
	p.mu.Unlock()

	for _, c := range idle {
		_ = c.Close()
	}
}

// Pipeline sends cmds in one write and reads their replies, on one connection.
func (p *Pool) Pipeline(cmds [][]string) ([]Value, error) {
	c, err := p.get()
	if err != nil {
		return nil, err
	}

	replies, err := c.Pipeline(time.Now().Add(p.opts.Timeout), cmds)
	p.put(c)

	return replies, err
}

// get returns an idle connection, dials a new one while fewer than PoolSize are
// open, or waits for one for up to WaitTimeout. A pool closed meanwhile hands
// out nothing.
func (p *Pool) get() (*Conn, error) {
	if c, dial, err := p.reserve(); c != nil || dial || err != nil {
		return p.finish(c, dial, err)
	}

	return p.wait()
}

// wait is get when every connection is in use: a function of its own, so that
// the common case does not allocate its frame (tierlimit's doc.go: frames).
func (p *Pool) wait() (*Conn, error) {
	ch := p.enqueue()
	if ch == nil {
		return p.get()
	}

	// The timeout comes through ch too, sent by expire: one receive, no
	// select. Under Yaegi a select on ch and a timer's channel now and then
	// saw neither for seconds past the timeout (a request held for more than
	// 10s under load).
	timer := time.AfterFunc(p.opts.WaitTimeout, func() { p.expire(ch) })
	g := <-ch
	timer.Stop()

	return p.granted(g)
}

// expire ends the wait of ch with ErrPoolTimeout if it is still queued;
// if not, a grant is in ch or on its way, and the waiter takes it.
func (p *Pool) expire(ch chan grant) {
	defer func() { _ = recover() }() // a timer's goroutine: a panic would end Traefik

	if p.dequeue(ch) {
		ch <- grant{err: fmt.Errorf("waiting %s for one of %d connections: %w", p.opts.WaitTimeout, p.opts.PoolSize, ErrPoolTimeout)}
	}
}

// enqueue adds a waiter at the back of the queue, or returns nil when a
// connection or a slot became free since reserve looked (or the pool
// closed): the caller then takes it through get.
func (p *Pool) enqueue() chan grant {
	p.mu.Lock()

	if p.closed || len(p.idle) > 0 || p.open < p.opts.PoolSize {
		p.mu.Unlock()
		return nil
	}

	ch := make(chan grant, 1)
	p.queue = append(p.queue, ch)
	p.waiting++
	p.mu.Unlock()

	return ch
}

// dequeue removes a waiter that gave up, and reports whether it was still
// queued: if not, a grant is in its channel. An index loop: under Yaegi a
// range with a value over a slice of channels panics.
func (p *Pool) dequeue(ch chan grant) bool {
	p.mu.Lock()
	defer p.mu.Unlock()

	q := p.queue
	for i := 0; i < len(q); i++ {
		if q[i] == ch {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			p.queue = q[:len(q)-1]
			p.waiting--

			return true
		}
	}

	return false
}

// next takes the oldest waiter off the queue, or returns nil; under p.mu.
func (p *Pool) next() chan grant {
	if len(p.queue) == 0 {
		return nil
	}

	ch := p.queue[0]
	p.queue[0] = nil
	p.queue = p.queue[1:]
	p.waiting--

	return ch
}

// granted turns what a waiter was handed into get's result.
func (p *Pool) granted(g grant) (*Conn, error) {
	if g.dial {
		return p.finish(nil, true, nil)
	}

	return g.c, g.err
}

// reserve takes an idle connection, or a slot to dial one (dial), under the
// lock. It runs on every call: no defer, which costs under Yaegi.
func (p *Pool) reserve() (*Conn, bool, error) {
	p.mu.Lock()

	if n := len(p.idle); n > 0 && !p.closed {
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()

		return c, false, nil
	}

	closed, dial := p.closed, !p.closed && p.open < p.opts.PoolSize
	if dial {
		p.open++
	}

	p.mu.Unlock()

	if closed {
		return nil, false, ErrClosed
	}

	return nil, dial, nil
}

func (p *Pool) finish(c *Conn, dial bool, err error) (*Conn, error) {
	if !dial {
		return c, err
	}

	c, err = p.dial()
	if err != nil {
		p.release(err)
		return nil, err
	}

	return c, nil
}

// release gives back the slot of a failed dial, and ends every wait with its
// error: the next dial would fail alike, and each waiter trying in turn would
// keep a burst waiting DialTimeout times the queue's length.
func (p *Pool) release(err error) {
	p.mu.Lock()
	p.open--
	endWaits(p, err)
	p.mu.Unlock()
}

// endWaits hands err to every waiter, under p.mu: each channel has room for
// its one grant, so no send blocks. One waiter at a time off the queue: under
// Yaegi a range with a value over a slice of channels panics ("reflect: call
// of reflect.Value.Len on int Value"; e2e's TestRedisClientsCloseUnderYaegi).
func endWaits(p *Pool, err error) {
	for len(p.queue) > 0 {
		ch := p.next()
		ch <- grant{err: err}
	}
}

// put returns a healthy connection to the pool, or to the oldest waiter; a
// broken one is closed and its slot handed to the oldest waiter to dial
// anew. Once the pool is closed, any connection is closed.
func (p *Pool) put(c *Conn) {
	p.mu.Lock()

	if p.closed {
		p.open--
		p.mu.Unlock()
		_ = c.Close()

		return
	}

	broken := c.Err() != nil
	ch := p.next()

	switch {
	case ch != nil && broken:
		p.mu.Unlock()
		_ = c.Close()
		ch <- grant{dial: true}
	case ch != nil:
		p.mu.Unlock()
		ch <- grant{c: c}
	case broken:
		p.open--
		p.mu.Unlock()
		_ = c.Close()
	default:
		p.idle = append(p.idle, c)
		p.mu.Unlock()
	}
}

// dial opens a connection and sets it up (AUTH, SELECT, ROLE), all within
// DialTimeout.
func (p *Pool) dial() (*Conn, error) {
	deadline := time.Now().Add(p.opts.DialTimeout)

	nc, err := p.connect(deadline)
	if err != nil {
		return nil, err
	}

	c := NewConn(nc, p.opts.Limits)
	c.timeout = p.opts.Timeout

	return p.setup(c, deadline)
}

// connect opens the TCP connection, and does the TLS handshake when asked.
func (p *Pool) connect(deadline time.Time) (net.Conn, error) {
	d := net.Dialer{Timeout: p.opts.DialTimeout}

	nc, err := d.Dial("tcp", p.opts.Address)
	if err != nil {
		return nil, fmt.Errorf("dialing redis at %s: %w", p.opts.Address, err)
	}

	if !p.opts.TLS {
		return nc, nil
	}

	host, _, _ := net.SplitHostPort(p.opts.Address)

	cfg, err := p.opts.TLSConfig.Config(host)
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("TLS with redis at %s: %w", p.opts.Address, err)
	}

	tc := tls.Client(nc, cfg)
	_ = tc.SetDeadline(deadline)

	if err := tc.Handshake(); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("TLS handshake with redis at %s: %w", p.opts.Address, err)
	}

	return tc, nil
}

// setupCommands are what a new connection sends before its first call.
func (p *Pool) setupCommands() [][]string {
	var setup [][]string

	switch {
	case p.opts.Password != "" && p.opts.Username != "":
		setup = append(setup, []string{"AUTH", p.opts.Username, p.opts.Password})
	case p.opts.Password != "":
		setup = append(setup, []string{"AUTH", p.opts.Password})
	}

	if p.opts.DB != 0 {
		setup = append(setup, []string{"SELECT", strconv.Itoa(p.opts.DB)})
	}

	if p.opts.RequirePrimary {
		setup = append(setup, []string{"ROLE"})
	}

	return setup
}

// setup sends the setup commands on c, in one round trip, and closes c when
// one fails or the server is not the primary required.
func (p *Pool) setup(c *Conn, deadline time.Time) (*Conn, error) {
	setup := p.setupCommands()
	if len(setup) == 0 {
		return c, nil
	}

	replies, err := c.Pipeline(deadline, setup)
	if err != nil {
		return nil, fmt.Errorf("setting up redis connection to %s: %w", p.opts.Address, err)
	}

	for i, v := range replies {
		if v.IsError() {
			_ = c.Close()
			// The reply names the failure (WRONGPASS, NOAUTH, ERR DB index...); it never contains the password.
			return nil, fmt.Errorf("%s on redis at %s: %s", setup[i][0], p.opts.Address, v.Str)
		}
	}

	if p.opts.RequirePrimary {
		if role := replies[len(replies)-1]; len(role.Array) == 0 || role.Array[0].Str != "master" {
			_ = c.Close()
			return nil, fmt.Errorf("%w: redis at %s answers ROLE %s", ErrNotPrimary, p.opts.Address, roleName(role))
		}
	}

	return c, nil
}

// Close closes the idle connections; connections in use close when returned.
func (p *Pool) Close() {
	p.mu.Lock()
	idle := p.idle
	// One field at a time: see e2e/yaegirules_test.go.
	p.idle = nil
	p.closed = true
	p.open -= len(idle)
	endWaits(p, ErrClosed)
	p.mu.Unlock()

	for _, c := range idle {
		_ = c.Close()
	}
}

func roleName(v Value) string {
	if len(v.Array) > 0 {
		return v.Array[0].Str
	}

	return v.String()
}
