package redisresp

import (
	"errors"
	"fmt"
	"strings"
	"sync"
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
// was demoted or lost its own primary), and asks again on the next call: the
// sentinels are asked only then, never on every call, and from the caller's
// goroutine, never from one of its own.
type Sentinel struct {
	opts Options // the primary's settings; Address is set per discovery

	mu       sync.Mutex
	pool     *Pool // the primary's connections; nil until found, or after it failed
	primary  string
	attempts int   // discoveries made, so that callers who waited for one share its outcome
	lastErr  error // the last discovery's error
	next     int   // the sentinel to ask first: the one that answered last
	closed   bool

	discovering sync.Mutex // one discovery at a time
}

// NewSentinel returns a client of opts.Sentinel's primary; it does no I/O.
func NewSentinel(opts Options) *Sentinel {
	opts.RequirePrimary = true
	opts = NewPool(opts).opts // the defaults

	return &Sentinel{opts: opts}
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
	s.mu.Lock()
	p, attempts := s.pool, s.attempts
	s.mu.Unlock()

	if p == nil {
		var err error
		if p, err = s.discover(attempts); err != nil {
			return nil, "", err
		}
	}

	ints, serverErr, err := p.DoInts(cmd)
	if (err != nil && !errors.Is(err, ErrPoolTimeout)) || (serverErr != "" && LostPrimary(serverErr)) {
		s.forget(p)
	}

	return ints, serverErr, err
}

// LostPrimary reports whether a server error says that the server is no
// longer a usable primary.
func LostPrimary(serverErr string) bool {
	return strings.HasPrefix(serverErr, "READONLY") || strings.HasPrefix(serverErr, "MASTERDOWN") ||
		strings.Contains(serverErr, "-READONLY") || strings.Contains(serverErr, "-MASTERDOWN")
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

	if err == nil && !s.closed {
		opts := s.opts
		opts.Address = addr
		p = NewPool(opts)
		s.pool, s.primary = p, addr
	}
	s.mu.Unlock()

	if err != nil {
		return nil, err
	}

	if p == nil {
		return nil, ErrClosed
	}

	return p, nil
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
	so := s.opts.Sentinel
	p := NewPool(Options{
		Address: sentinel, Username: so.Username, Password: so.Password,
		TLS: s.opts.TLS, TLSConfig: s.opts.TLSConfig,
		DialTimeout: s.opts.DialTimeout, Timeout: s.opts.DialTimeout, PoolSize: 1, Limits: s.opts.Limits,
	})
	defer p.Close()

	v, err := p.Do("SENTINEL", "get-master-addr-by-name", so.MasterName)
	if err != nil {
		return "", fmt.Errorf("asking sentinel %s: %w", sentinel, err)
	}

	if v.IsError() {
		return "", fmt.Errorf("sentinel %s: %s", sentinel, v.Str)
	}

	if v.Null || len(v.Array) != 2 || v.Array[0].Str == "" || v.Array[1].Str == "" {
		return "", fmt.Errorf("sentinel %s does not know %q", sentinel, so.MasterName)
	}

	host := v.Array[0].Str
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}

	return host + ":" + v.Array[1].Str, nil
}

// Close closes the primary's connections; later calls fail with ErrClosed.
func (s *Sentinel) Close() {
	s.mu.Lock()
	p := s.pool
	s.pool, s.closed = nil, true
	s.mu.Unlock()

	if p != nil {
		p.Close()
	}
}
