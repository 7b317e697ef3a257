package redisresp

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"
)

// SentinelOptions name a group that Redis Sentinel monitors.
type SentinelOptions struct {
	MasterName string   // the group's name in the sentinels' configuration
	Addresses  []string // sentinels, host:port; any one that answers is enough
	Username   string   // the sentinels' own ACL user, if any
	Password   string   // the sentinels' own password, if any
}

// Sentinel is a Client of a monitored group's primary. It asks the sentinels
// for the primary (SENTINEL get-master-addr-by-name) when it has none, and
// checks each new connection with ROLE. It forgets the primary when a call
// fails on the connection or the server answers READONLY or MASTERDOWN (it
// was demoted or lost its own primary), and asks again on the next call.
//
// A failover that leaves the old primary running (SENTINEL FAILOVER, a
// partition) fails no call: the sentinels reconfigure the old primary only
// seconds later, and until then it accepts writes. So once a primary is
// known, one goroutine per Sentinel follows the sentinels' +switch-master
// announcements and moves calls to the new primary as soon as they switch.
// It also asks for the primary each time it (re)connects, every
// watchRefresh at least, in case an announcement was missed. The sentinels
// are never asked on every call, and no call waits for them except the
// first, or the one after the primary failed.
type Sentinel struct {
	opts Options // the primary's settings; Address is set per discovery

	// OnSwitch, when set before the first call, is called (from the watching
	// goroutine or a caller's) each time the primary changes address.
	OnSwitch func(from, to string)

	// refresh is how long the watching connection waits for an announcement
	// before it asks for the primary again: watchRefresh, or a test's.
	refresh time.Duration

	mu       sync.Mutex
	pool     *Pool  // the primary's connections; nil until found, or after it failed
	primary  string // the primary's address, kept after it failed
	attempts int    // discoveries made, so that callers who waited for one share its outcome
	lastErr  error  // the last discovery's error
	next     int    // the sentinel to ask first: the one that answered last
	closed   bool
	watching bool
	watchC   *Conn         // the watching goroutine's connection, closed by Close
	done     chan struct{} // closed by Close

	discovering sync.Mutex // one discovery at a time
}

// watchRefresh bounds how long the watching connection waits for an
// announcement before it reconnects and asks for the primary again, so that
// a sentinel lost without a word (a host gone) is noticed.
const watchRefresh = 10 * time.Second

// NewSentinel returns a client of opts.Sentinel's primary; it does no I/O.
func NewSentinel(opts Options) *Sentinel {
	opts.RequirePrimary = true
	opts = NewPool(opts).opts // the defaults

	return &Sentinel{opts: opts, refresh: watchRefresh, done: make(chan struct{})}
}

// Primary returns the address of the primary in use, or "".
func (s *Sentinel) Primary() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	if s.pool == nil {
		return ""
	}

	return s.primary
}

// DoInts runs cmd on the primary, finding it first if need be.
func (s *Sentinel) DoInts(cmd string) ([]int64, string, error) {
	p, err := sentinelPrimary(s)
	if err != nil {
		return nil, "", err
	}

	ints, serverErr, err := p.DoInts(cmd)
	if err != nil && errors.Is(err, ErrClosed) {
		if np := sentinelSwitched(s, p); np != nil {
			p = np
			ints, serverErr, err = p.DoInts(cmd)
		}
	}

	if (serverErr != "" && LostPrimary(serverErr)) || errors.Is(err, ErrNotPrimary) {
		return sentinelRetryInts(s, p, cmd, ints, serverErr, err)
	}

	if err != nil && !errors.Is(err, ErrPoolTimeout) {
		s.forget(p)
	}

	return ints, serverErr, err
}

// sentinelRetryInts is DoInts after p answered READONLY or MASTERDOWN
// (ints, serverErr), or turned out a replica (err, ErrNotPrimary): p was
// demoted, or lost its own primary, in a failover that the sentinels may
// have finished already. They are asked at once (sentinelRetry), and the
// call runs again on the primary they name, rather than the rate limiter's
// deciding in memory for a back-off.
func sentinelRetryInts(s *Sentinel, p *Pool, cmd string, ints []int64, serverErr string, err error) ([]int64, string, error) {
	np := sentinelRetry(s, p)
	if np == nil {
		return ints, serverErr, err
	}

	ints, serverErr, err = np.DoInts(cmd)
	if (err != nil && !errors.Is(err, ErrPoolTimeout)) || (serverErr != "" && LostPrimary(serverErr)) {
		s.forget(np)
	}

	return ints, serverErr, err
}

// sentinelRetry forgets p, which said it is no longer a usable primary, asks
// the sentinels for the primary at once, and returns its pool when they name
// another server; nil when they still name p's (they have not switched yet:
// their announcement will end the back-off, Sentinel.OnSwitch) or cannot
// be asked. A server that refused the call wrote nothing: a replica refuses
// a script at its first write, and MASTERDOWN refuses any command.
func sentinelRetry(s *Sentinel, p *Pool) *Pool {
	s.forget(p)

	s.mu.Lock()
	attempts := s.attempts
	s.mu.Unlock()

	np, err := s.discover(attempts)
	if err != nil || np == nil || np.opts.Address == p.opts.Address {
		return nil
	}

	return np
}

// SentinelScriptInts is ScriptInts on the primary s follows, found first if
// need be. As DoInts does, it drops the primary when the call fails or the
// server says it is no longer the primary, so that the next call finds it
// again.
func SentinelScriptInts(s *Sentinel, call Call, cmd string) (int64, []int64, error) {
	p, err := sentinelPrimary(s)
	if err != nil {
		return -1, nil, err
	}

	n, ints, err := ScriptInts(p, nil, call, cmd)
	if err != nil && errors.Is(err, ErrClosed) {
		if np := sentinelSwitched(s, p); np != nil {
			p = np
			n, ints, err = ScriptInts(p, nil, call, cmd)
		}
	}

	if err != nil && lostPrimary(err) {
		return sentinelRetryScript(s, p, call, cmd, err)
	}

	return n, ints, err
}

// sentinelRetryScript is SentinelScriptInts after its call on p failed with
// err, which says that p is no longer the primary: when the server answered
// READONLY or MASTERDOWN, or turned out a replica, the call runs again on
// the primary the sentinels name now (sentinelRetry), if another; else p is
// forgotten, and the next call finds the primary.
func sentinelRetryScript(s *Sentinel, p *Pool, call Call, cmd string, err error) (int64, []int64, error) {
	if !errors.Is(err, ErrServer) && !errors.Is(err, ErrNotPrimary) {
		s.forget(p)
		return -1, nil, err
	}

	np := sentinelRetry(s, p)
	if np == nil {
		return -1, nil, err
	}

	n, ints, err := ScriptInts(np, nil, call, cmd)
	if err != nil && lostPrimary(err) {
		s.forget(np)
	}

	return n, ints, err
}

// sentinelPrimary returns the pool of the primary s follows, finding it
// first if need be. A function, as SentinelScriptInts: the rate limiter's
// calls come through it (ScriptInts).
func sentinelPrimary(s *Sentinel) (*Pool, error) {
	s.mu.Lock()
	p := s.pool
	attempts := s.attempts
	s.mu.Unlock()

	if p != nil {
		return p, nil
	}

	return s.discover(attempts)
}

// sentinelSwitched returns the primary's pool when the watcher switched to a
// new primary (closing p) after a call took p, so that the call goes to the
// new one, not to memory; else nil.
func sentinelSwitched(s *Sentinel, p *Pool) *Pool {
	s.mu.Lock()
	np := s.pool
	s.mu.Unlock()

	if np != nil && np != p {
		return np
	}

	return nil
}

// lostPrimary reports whether a ScriptInts error says that the primary is
// gone: the connection failed (a full pool is not the server's doing), or
// the server answered READONLY or MASTERDOWN.
func lostPrimary(err error) bool {
	if errors.Is(err, ErrServer) {
		return LostPrimary(strings.TrimPrefix(err.Error(), ErrServer.Error()+": "))
	}

	return !errors.Is(err, ErrPoolTimeout)
}

// LostPrimary reports whether a server error says that the server is no
// longer a usable primary.
func LostPrimary(serverErr string) bool {
	return strings.HasPrefix(serverErr, "READONLY") || strings.HasPrefix(serverErr, "MASTERDOWN") ||
		strings.Contains(serverErr, "-READONLY") || strings.Contains(serverErr, "-MASTERDOWN")
}

// DropIdle closes the idle connections to the primary (Pool.DropIdle).
func (s *Sentinel) DropIdle() {
	s.mu.Lock()
	p := s.pool
	s.mu.Unlock()

	if p != nil {
		p.DropIdle()
	}
}

// forget drops p if it is still the primary in use.
func (s *Sentinel) forget(p *Pool) {
	s.mu.Lock()
	current := s.pool == p
	if current {
		s.pool = nil
	}
	s.mu.Unlock()

	if current {
		p.Close()
	}
}

// discover finds the primary. Callers that waited while another discovery
// ran (seen is the count they saw before) take its outcome rather than ask
// the sentinels again, so that a failed discovery costs one round of
// timeouts, not one per waiting caller.
func (s *Sentinel) discover(seen int) (*Pool, error) {
	s.discovering.Lock()
	defer s.discovering.Unlock()

	s.mu.Lock()
	p, attempts, lastErr, closed := s.pool, s.attempts, s.lastErr, s.closed
	s.mu.Unlock()

	switch {
	case closed:
		return nil, ErrClosed
	case p != nil:
		return p, nil
	case attempts != seen && lastErr != nil:
		return nil, lastErr
	}

	addr, err := s.ask()

	s.mu.Lock()
	s.attempts++
	s.lastErr = err
	s.mu.Unlock()

	if err != nil {
		return nil, err
	}

	if p = s.use(addr); p == nil {
		return nil, ErrClosed
	}

	return p, nil
}

// use makes addr the primary, unless it is already, and returns its pool
// (nil once closed). A change of address is reported to OnSwitch; the
// watching goroutine starts with the first primary.
func (s *Sentinel) use(addr string) *Pool {
	s.mu.Lock()

	if s.closed {
		s.mu.Unlock()
		return nil
	}

	if s.pool != nil && s.primary == addr {
		p := s.pool
		s.mu.Unlock()

		return p
	}

	old, from := s.pool, s.primary
	opts := s.opts
	opts.Address = addr
	p := NewPool(opts)
	s.pool, s.primary = p, addr

	watch := !s.watching
	s.watching = true
	s.mu.Unlock()

	if old != nil {
		old.Close()
	}

	if from != "" && from != addr && s.OnSwitch != nil {
		s.OnSwitch(from, addr)
	}

	if watch {
		go s.watch()
	}

	return p
}

// watch follows the sentinels' announcements until Close, one sentinel at a
// time, moving to the next when one fails.
func (s *Sentinel) watch() {
	defer func() {
		// A panic here must not take Traefik down: the next discovery starts
		// another watcher.
		if recover() != nil {
			s.mu.Lock()
			s.watching = false
			s.mu.Unlock()
		}
	}()

	for n := 0; ; n++ {
		s.mu.Lock()
		closed, first := s.closed, s.next
		s.mu.Unlock()

		if closed {
			return
		}

		addresses := s.opts.Sentinel.Addresses
		if err := s.watchOne(addresses[(first+n)%len(addresses)]); err == nil {
			n-- // the same sentinel again: it answered, it only had nothing to say
			continue
		}

		// Every sentinel failed once in a row: pause before the next round.
		if (n+1)%len(addresses) == 0 {
			t := time.NewTimer(time.Second)
			select {
			case <-s.done:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// watchOne asks one sentinel for the primary and follows its +switch-master
// announcements until s.refresh passes without one (nil) or the
// connection fails.
func (s *Sentinel) watchOne(sentinel string) error {
	p := NewPool(s.sentinelOptions(sentinel))
	defer p.Close()

	c, err := p.get()
	if err != nil {
		return err
	}

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()

		return ErrClosed
	}
	s.watchC = c
	s.mu.Unlock()

	defer func() {
		s.mu.Lock()
		s.watchC = nil
		s.mu.Unlock()
		_ = c.Close()
	}()

	name := s.opts.Sentinel.MasterName

	replies, err := c.Pipeline(time.Now().Add(s.opts.DialTimeout), [][]string{
		{"SENTINEL", "get-master-addr-by-name", name}, {"SUBSCRIBE", "+switch-master"},
	})
	if err != nil {
		return err
	}

	if addr, aerr := masterAddr(sentinel, name, replies[0]); aerr == nil {
		s.use(addr)
	}

	if replies[1].IsError() {
		return fmt.Errorf("sentinel %s: SUBSCRIBE: %s", sentinel, replies[1].Str)
	}

	return s.listen(c, name)
}

// listen follows the +switch-master messages of the subscribed connection c
// until it fails, or stays quiet for s.refresh (then nil: watchOne's
// caller subscribes afresh, which also asks for the primary again).
func (s *Sentinel) listen(c *Conn, name string) error {
	for {
		v, err := c.Receive(time.Now().Add(s.refresh))
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}

			return err
		}

		// ["message", "+switch-master", "<name> <old ip> <old port> <new ip> <new port>"]
		if len(v.Array) != 3 || v.Array[0].Str != "message" {
			continue
		}

		f := strings.Fields(v.Array[2].Str)
		if len(f) == 5 && f[0] == name {
			s.use(joinHostPort(f[3], f[4]))
		}
	}
}

func (s *Sentinel) sentinelOptions(sentinel string) Options {
	so := s.opts.Sentinel

	return Options{
		Address: sentinel, Username: so.Username, Password: so.Password,
		TLS: s.opts.TLS, TLSConfig: s.opts.TLSConfig,
		DialTimeout: s.opts.DialTimeout, Timeout: s.opts.DialTimeout, PoolSize: 1, Limits: s.opts.Limits,
	}
}

// ask asks each sentinel in turn, starting with the last that answered, for
// the primary's address.
func (s *Sentinel) ask() (string, error) {
	so := s.opts.Sentinel

	s.mu.Lock()
	first := s.next
	s.mu.Unlock()

	var errs []string

	for i := 0; i < len(so.Addresses); i++ {
		n := (first + i) % len(so.Addresses)

		addr, err := s.askOne(so.Addresses[n])
		if err == nil {
			s.mu.Lock()
			s.next = n
			s.mu.Unlock()

			return addr, nil
		}

		errs = append(errs, err.Error())
	}

	return "", fmt.Errorf("%w %q: %s", ErrNoPrimary, so.MasterName, strings.Join(errs, "; "))
}

func (s *Sentinel) askOne(sentinel string) (string, error) {
	p := NewPool(s.sentinelOptions(sentinel))
	defer p.Close()

	v, err := p.Do("SENTINEL", "get-master-addr-by-name", s.opts.Sentinel.MasterName)
	if err != nil {
		return "", fmt.Errorf("asking sentinel %s: %w", sentinel, err)
	}

	return masterAddr(sentinel, s.opts.Sentinel.MasterName, v)
}

// masterAddr reads a reply to SENTINEL get-master-addr-by-name.
func masterAddr(sentinel, name string, v Value) (string, error) {
	if v.IsError() {
		return "", fmt.Errorf("sentinel %s: %s", sentinel, v.Str)
	}

	if v.Null || len(v.Array) != 2 || v.Array[0].Str == "" || v.Array[1].Str == "" {
		return "", fmt.Errorf("sentinel %s does not know %q", sentinel, name)
	}

	return joinHostPort(v.Array[0].Str, v.Array[1].Str), nil
}

func joinHostPort(host, port string) string {
	return net.JoinHostPort(host, port)
}

// Close closes the primary's connections and stops the watching goroutine;
// later calls fail with ErrClosed.
func (s *Sentinel) Close() {
	s.mu.Lock()
	p, c, closed := s.pool, s.watchC, s.closed
	s.pool = nil
	s.closed = true
	s.mu.Unlock()

	if closed {
		return
	}

	close(s.done)

	if c != nil {
		_ = c.nc.Close() // ends the watcher's read; the watcher owns the Conn
	}

	if p != nil {
		p.Close()
	}
}
