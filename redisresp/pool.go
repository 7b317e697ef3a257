package redisresp

import (
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"
)

// Options configure a Pool. Zero durations and sizes take the defaults noted.
type Options struct {
	Address     string        // host:port
	Username    string        // ACL user; empty for the default user
	Password    string        // AUTH is sent when set
	DB          int           // SELECT is sent when not 0
	TLS         bool          // TLS with the system roots, server name from Address
	DialTimeout time.Duration // connect, TLS and AUTH/SELECT; default 250ms
	Timeout     time.Duration // each call, from taking a connection to the last reply; default 100ms
	PoolSize    int           // connections open at most; default 16
	Limits      Limits        // zero fields take DefaultLimits' values
}

// Pool is a bounded pool of connections. New connections are dialled on
// demand, never by NewPool. Safe for concurrent use.
type Pool struct {
	opts  Options
	idle  chan *Conn    // connections ready for use
	slots chan struct{} // one token per open connection, PoolSize at most

	mu     sync.Mutex
	closed bool
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

	return &Pool{
		opts:  opts,
		idle:  make(chan *Conn, opts.PoolSize),
		slots: make(chan struct{}, opts.PoolSize),
	}
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

// DoEncoded runs one command already encoded in RESP (an array of bulk
// strings, see Bulk), like Do. Callers that send the same arguments often
// encode them once.
func (p *Pool) DoEncoded(cmd string) (Value, error) {
	c, err := p.get()
	if err != nil {
		return Value{}, err
	}

	v, err := c.DoEncoded(time.Now().Add(p.opts.Timeout), cmd)
	p.put(c)

	return v, err
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
// open, or waits for one until the call's timeout. A pool closed meanwhile
// hands out nothing.
func (p *Pool) get() (*Conn, error) {
	if p.isClosed() {
		return nil, ErrClosed
	}

	c, err := p.take()
	if err == nil && p.isClosed() {
		p.put(c)
		return nil, ErrClosed
	}

	return c, err
}

func (p *Pool) take() (*Conn, error) {
	select {
	case c := <-p.idle:
		return c, nil
	default:
	}

	select {
	case p.slots <- struct{}{}:
		return p.dialSlot()
	default:
	}

	timer := time.NewTimer(p.opts.Timeout)
	defer timer.Stop()

	select {
	case c := <-p.idle:
		return c, nil
	case p.slots <- struct{}{}:
		return p.dialSlot()
	case <-timer.C:
		return nil, fmt.Errorf("waiting %s for one of %d connections: %w", p.opts.Timeout, p.opts.PoolSize, ErrPoolTimeout)
	}
}

// dialSlot dials while holding a slot, and gives the slot back on failure or
// when the pool was closed while the caller waited for the slot.
func (p *Pool) dialSlot() (*Conn, error) {
	if p.isClosed() {
		<-p.slots
		return nil, ErrClosed
	}

	c, err := p.dial()
	if err != nil {
		<-p.slots
		return nil, err
	}

	return c, nil
}

// put returns a healthy connection to the pool and closes a broken one, or
// any once the pool is closed. The lock orders it with Close, so that no
// connection is left idle in a closed pool.
func (p *Pool) put(c *Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()

	if c.Err() != nil || p.closed {
		_ = c.Close()
		<-p.slots

		return
	}

	p.idle <- c // never blocks: idle holds at most as many as there are slots
}

func (p *Pool) dial() (*Conn, error) {
	deadline := time.Now().Add(p.opts.DialTimeout)
	d := net.Dialer{Timeout: p.opts.DialTimeout}

	nc, err := d.Dial("tcp", p.opts.Address)
	if err != nil {
		return nil, fmt.Errorf("dialing redis at %s: %w", p.opts.Address, err)
	}

	if p.opts.TLS {
		host, _, _ := net.SplitHostPort(p.opts.Address)
		tc := tls.Client(nc, &tls.Config{ServerName: host, MinVersion: tls.VersionTLS12})
		_ = tc.SetDeadline(deadline)

		if err := tc.Handshake(); err != nil {
			_ = nc.Close()
			return nil, fmt.Errorf("TLS handshake with redis at %s: %w", p.opts.Address, err)
		}

		nc = tc
	}

	c := NewConn(nc, p.opts.Limits)

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

	return c, nil
}

func (p *Pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()

	return p.closed
}

// Close closes the idle connections; connections in use close when returned.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()

	p.closed = true

	for {
		select {
		case c := <-p.idle:
			_ = c.Close()
			<-p.slots
		default:
			return
		}
	}
}
