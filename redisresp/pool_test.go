package redisresp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// failAfter bounds every wait on the fake server; reaching it is a test
// failure, never the expected outcome.
const failAfter = 10 * time.Second

// closeConn, returned by a handler, makes the fake server close the connection
// instead of answering.
const closeConn = "\x00close"

// srvCmd is one command received by the fake server.
type srvCmd struct {
	conn int // 1 for the first accepted connection
	args []string
}

// fakeServer is a Redis stand-in: it accepts connections on 127.0.0.1, parses
// RESP arrays of bulk strings, and writes whatever its handler returns (raw
// RESP; "" writes nothing; closeConn closes the connection).
type fakeServer struct {
	ln     net.Listener
	handle func(conn int, args []string) string
	done   chan struct{} // closed when the server stops

	mu       sync.Mutex
	accepted int
	cmds     []srvCmd
	conns    []net.Conn
	gone     map[int]chan struct{} // closed when a connection's reads end
	wg       sync.WaitGroup
	stopOnce sync.Once
}

// newServer listens; start serves. Two steps, so that a handler may use the server.
func newServer(t *testing.T) *fakeServer {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}

	s := &fakeServer{ln: ln, done: make(chan struct{}), gone: map[int]chan struct{}{}}
	t.Cleanup(s.stop)

	return s
}

func (s *fakeServer) start(handle func(conn int, args []string) string) {
	s.handle = handle
	s.wg.Add(1)

	go s.acceptLoop()
}

func startServer(t *testing.T, handle func(conn int, args []string) string) *fakeServer {
	t.Helper()

	s := newServer(t)
	s.start(handle)

	return s
}

func (s *fakeServer) addr() string {
	return s.ln.Addr().String()
}

func (s *fakeServer) acceptLoop() {
	defer s.wg.Done()

	for {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}

		s.mu.Lock()
		s.accepted++
		id := s.accepted
		s.conns = append(s.conns, nc)
		gone := make(chan struct{})
		s.gone[id] = gone
		s.mu.Unlock()

		s.wg.Add(1)

		go s.serve(id, nc, gone)
	}
}

func (s *fakeServer) serve(id int, nc net.Conn, gone chan struct{}) {
	defer s.wg.Done()
	defer close(gone)
	defer nc.Close()

	br := bufio.NewReader(nc)

	for {
		args, err := readCommand(br)
		if err != nil {
			return
		}

		s.mu.Lock()
		s.cmds = append(s.cmds, srvCmd{conn: id, args: args})
		s.mu.Unlock()

		switch reply := s.handle(id, args); reply {
		case "":
		case closeConn:
			return
		default:
			if _, err := io.WriteString(nc, reply); err != nil {
				return
			}
		}
	}
}

// readCommand parses one RESP array of bulk strings, strictly.
func readCommand(br *bufio.Reader) ([]string, error) {
	n, err := readHeader(br, '*')
	if err != nil {
		return nil, err
	}

	args := make([]string, 0, n)

	for i := 0; i < n; i++ {
		size, err := readHeader(br, '$')
		if err != nil {
			return nil, err
		}

		buf := make([]byte, size+2)
		if _, err := io.ReadFull(br, buf); err != nil {
			return nil, err
		}

		if string(buf[size:]) != "\r\n" {
			return nil, errors.New("bulk not terminated by CRLF")
		}

		args = append(args, string(buf[:size]))
	}

	return args, nil
}

func readHeader(br *bufio.Reader, kind byte) (int, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return 0, err
	}

	if len(line) < 4 || line[0] != kind || !strings.HasSuffix(line, "\r\n") {
		return 0, fmt.Errorf("bad header %q", line)
	}

	n, err := strconv.Atoi(line[1 : len(line)-2])
	if err != nil || n < 0 || n > 1<<20 {
		return 0, fmt.Errorf("bad header %q", line)
	}

	return n, nil
}

// stop closes the listener and every connection, and waits for the server's goroutines.
func (s *fakeServer) stop() {
	s.stopOnce.Do(func() {
		close(s.done)
		_ = s.ln.Close()

		s.mu.Lock()
		for _, nc := range s.conns {
			_ = nc.Close()
		}
		s.mu.Unlock()

		s.wg.Wait()
	})
}

func (s *fakeServer) acceptedCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.accepted
}

func (s *fakeServer) log() []srvCmd {
	s.mu.Lock()
	defer s.mu.Unlock()

	return append([]srvCmd(nil), s.cmds...)
}

// waitGone waits until the server has seen connection id end (closed by the client).
func (s *fakeServer) waitGone(t *testing.T, id int) {
	t.Helper()

	s.mu.Lock()
	gone, ok := s.gone[id]
	s.mu.Unlock()

	if !ok {
		t.Fatalf("connection %d was never accepted", id)
	}

	select {
	case <-gone:
	case <-time.After(failAfter):
		t.Fatalf("connection %d still open after %s", id, failAfter)
	}
}

// wait blocks a handler until ch is closed or the server stops.
func (s *fakeServer) wait(ch <-chan struct{}) {
	select {
	case <-ch:
	case <-s.done:
	}
}

// signal closes ch once; safe to call from several handlers.
type signal struct {
	once sync.Once
	ch   chan struct{}
}

func newSignal() *signal {
	return &signal{ch: make(chan struct{})}
}

func (s *signal) fire() {
	s.once.Do(func() { close(s.ch) })
}

func waitSignal(t *testing.T, s *signal, what string) {
	t.Helper()

	select {
	case <-s.ch:
	case <-time.After(failAfter):
		t.Fatalf("%s did not happen within %s", what, failAfter)
	}
}

func bulk(s string) string {
	return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n"
}

// basicHandler answers AUTH, SELECT and PING with success, ECHO with its argument,
// and anything else with an error reply.
func basicHandler(_ int, args []string) string {
	if len(args) == 0 {
		return "-ERR empty command\r\n"
	}

	switch strings.ToUpper(args[0]) {
	case "AUTH", "SELECT":
		return "+OK\r\n"
	case "PING":
		return "+PONG\r\n"
	case "ECHO":
		if len(args) != 2 {
			return "-ERR wrong number of arguments for 'echo' command\r\n"
		}

		return bulk(args[1])
	default:
		return "-ERR unknown command '" + args[0] + "'\r\n"
	}
}

// longOptions gives generous timeouts, which only bound failures.
func longOptions(addr string) Options {
	return Options{Address: addr, DialTimeout: failAfter, Timeout: failAfter}
}

func sameArgs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}

	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}

	return true
}

// closedAddr returns an address on which nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}

	addr := ln.Addr().String()
	_ = ln.Close()

	return addr
}

// doWithin runs p.Do but fails the test if it has not returned after
// failAfter, so that a missing timeout fails rather than hangs.
func doWithin(t *testing.T, p *Pool, args ...string) (Value, error) {
	t.Helper()

	type result struct {
		v   Value
		err error
	}

	res := make(chan result, 1)

	go func() {
		v, err := p.Do(args...)
		res <- result{v, err}
	}()

	select {
	case r := <-res:
		return r.v, r.err
	case <-time.After(failAfter):
		t.Fatalf("Do%q did not return within %s", args, failAfter)
		return Value{}, nil
	}
}

func TestNewPoolDoesNoIO(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer ln.Close()

	p := NewPool(Options{Address: ln.Addr().String()})
	defer p.Close()

	// Had NewPool dialled, its connection would already be queued on the
	// listener and Accept would return it at once.
	_ = ln.(*net.TCPListener).SetDeadline(time.Now().Add(50 * time.Millisecond))

	nc, err := ln.Accept()
	if err == nil {
		nc.Close()
		t.Fatal("NewPool opened a connection")
	}

	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Accept: %v, want a timeout", err)
	}
}

func TestPoolDialError(t *testing.T) {
	addr := closedAddr(t)

	p := NewPool(Options{Address: addr, PoolSize: 1, Timeout: failAfter, DialTimeout: failAfter})
	defer p.Close()

	// Twice: a failed dial must give its slot back, or the second call
	// (PoolSize 1) would wait for a slot and fail with ErrPoolTimeout.
	for i := 0; i < 2; i++ {
		_, err := p.Do("PING")

		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "dial" {
			t.Fatalf("call %d: err = %v, want a dial *net.OpError", i, err)
		}

		if errors.Is(err, ErrPoolTimeout) {
			t.Fatalf("call %d: err = %v: slot of the failed dial not released", i, err)
		}

		if !strings.Contains(err.Error(), addr) {
			t.Fatalf("call %d: err = %v does not name %s", i, err, addr)
		}
	}

	if n := p.openCount(); n != 0 {
		t.Fatalf("%d slots held after failed dials", n)
	}
}

func TestPoolSetupCommands(t *testing.T) {
	cases := []struct {
		name string
		opts func(*Options)
		want [][]string
	}{
		{"none", func(*Options) {}, [][]string{{"PING"}}},
		{"password", func(o *Options) { o.Password = "pass" }, [][]string{{"AUTH", "pass"}, {"PING"}}},
		{"username and password", func(o *Options) { o.Username, o.Password = "user", "pass" },
			[][]string{{"AUTH", "user", "pass"}, {"PING"}}},
		{"db", func(o *Options) { o.DB = 3 }, [][]string{{"SELECT", "3"}, {"PING"}}},
		{"db 1", func(o *Options) { o.DB = 1 }, [][]string{{"SELECT", "1"}, {"PING"}}},
		{"password and db", func(o *Options) { o.Password, o.DB = "pass", 15 },
			[][]string{{"AUTH", "pass"}, {"SELECT", "15"}, {"PING"}}},
		{"username, password and db", func(o *Options) { o.Username, o.Password, o.DB = "user", "pass", 2 },
			[][]string{{"AUTH", "user", "pass"}, {"SELECT", "2"}, {"PING"}}},
		{"username without password", func(o *Options) { o.Username = "user" }, [][]string{{"PING"}}},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, basicHandler)

			opts := longOptions(s.addr())
			tc.opts(&opts)

			p := NewPool(opts)
			defer p.Close()

			v, err := p.Do("PING")
			if err != nil || v.Str != "PONG" {
				t.Fatalf("Do = %#v, %v", v, err)
			}

			// Setup runs once per connection, not per call.
			if v, err := p.Do("PING"); err != nil || v.Str != "PONG" {
				t.Fatalf("second Do = %#v, %v", v, err)
			}

			want := append(append([][]string(nil), tc.want...), []string{"PING"})
			got := s.log()

			if len(got) != len(want) {
				t.Fatalf("server got %v, want %v", got, want)
			}

			for i := range want {
				if got[i].conn != 1 || !sameArgs(got[i].args, want[i]) {
					t.Fatalf("command %d = %v on connection %d, want %v on connection 1", i, got[i].args, got[i].conn, want[i])
				}
			}
		})
	}
}

func TestPoolSetupErrors(t *testing.T) {
	const password = "s3cr3t-hunter2"

	cases := []struct {
		name     string
		opts     Options
		handler  func(int, []string) string
		contains []string
	}{
		{
			name: "wrong password",
			opts: Options{Password: password},
			handler: func(_ int, args []string) string {
				if args[0] == "AUTH" {
					return "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
				}

				return basicHandler(0, args)
			},
			contains: []string{"WRONGPASS", "AUTH"},
		},
		{
			name: "wrong user and password",
			opts: Options{Username: "bob", Password: password, DB: 1},
			handler: func(_ int, args []string) string {
				switch args[0] {
				case "AUTH":
					return "-WRONGPASS invalid username-password pair or user is disabled.\r\n"
				case "SELECT":
					return "-NOAUTH Authentication required.\r\n"
				}

				return basicHandler(0, args)
			},
			contains: []string{"WRONGPASS"},
		},
		{
			name: "bad db",
			opts: Options{Password: password, DB: 99},
			handler: func(_ int, args []string) string {
				if args[0] == "SELECT" {
					return "-ERR DB index is out of range\r\n"
				}

				return basicHandler(0, args)
			},
			contains: []string{"SELECT", "DB index is out of range"},
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, tc.handler)

			opts := tc.opts
			opts.Address, opts.DialTimeout, opts.Timeout, opts.PoolSize = s.addr(), failAfter, failAfter, 1

			p := NewPool(opts)
			defer p.Close()

			// Twice with PoolSize 1: the failed setup must give its slot back.
			for i := 1; i <= 2; i++ {
				v, err := p.Do("PING")
				if err == nil {
					t.Fatalf("call %d: Do = %#v, want a setup error", i, v)
				}

				for _, want := range tc.contains {
					if !strings.Contains(err.Error(), want) {
						t.Fatalf("call %d: err = %q, want it to contain %q", i, err, want)
					}
				}

				if strings.Contains(err.Error(), password) {
					t.Fatalf("call %d: err = %q contains the password", i, err)
				}

				if errors.Is(err, ErrPoolTimeout) {
					t.Fatalf("call %d: err = %v: slot of the failed setup not released", i, err)
				}

				// The client closed the connection it could not set up.
				s.waitGone(t, i)
			}

			for _, c := range s.log() {
				if c.args[0] == "PING" {
					t.Fatalf("command sent on a connection whose setup failed: %v", c.args)
				}
			}

			if n := s.acceptedCount(); n != 2 {
				t.Fatalf("server accepted %d connections, want 2", n)
			}
		})
	}
}

func TestPoolReusesConnection(t *testing.T) {
	s := startServer(t, basicHandler)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	for i := 0; i < 5; i++ {
		arg := "m" + strconv.Itoa(i)

		v, err := p.Do("ECHO", arg)
		if err != nil || v.Kind != KindBulk || v.Str != arg {
			t.Fatalf("Do %d = %#v, %v", i, v, err)
		}
	}

	// A server error reply leaves the connection in the pool too.
	if v, err := p.Do("NOPE"); err != nil || !v.IsError() {
		t.Fatalf("Do NOPE = %#v, %v; want an error value", v, err)
	}

	if v, err := p.Do("PING"); err != nil || v.Str != "PONG" {
		t.Fatalf("Do PING = %#v, %v", v, err)
	}

	if n := s.acceptedCount(); n != 1 {
		t.Fatalf("server accepted %d connections for sequential calls, want 1", n)
	}

	for _, c := range s.log() {
		if c.conn != 1 {
			t.Fatalf("command %v on connection %d", c.args, c.conn)
		}
	}
}

func TestPoolPipeline(t *testing.T) {
	s := startServer(t, basicHandler)

	p := NewPool(longOptions(s.addr()))
	defer p.Close()

	replies, err := p.Pipeline([][]string{{"ECHO", "a"}, {"NOPE"}, {"ECHO", "b"}})
	if err != nil {
		t.Fatalf("Pipeline: %v", err)
	}

	if len(replies) != 3 || replies[0].Str != "a" || !replies[1].IsError() || replies[2].Str != "b" {
		t.Fatalf("replies = %#v", replies)
	}

	log := s.log()
	if len(log) != 3 {
		t.Fatalf("server got %v", log)
	}

	for _, c := range log {
		if c.conn != 1 {
			t.Fatalf("pipelined command %v on connection %d, want all on 1", c.args, c.conn)
		}
	}
}

func TestPoolSizeBoundsConnections(t *testing.T) {
	const poolSize, callers = 2, 10

	var (
		mu       sync.Mutex
		inFlight int
		maxSeen  int
	)

	// Replies are held until poolSize commands are in flight at once, so the
	// pool must really open poolSize connections, and no more.
	full := newSignal()

	s := newServer(t)

	s.start(func(conn int, args []string) string {
		mu.Lock()
		inFlight++
		if inFlight > maxSeen {
			maxSeen = inFlight
		}
		if inFlight >= poolSize {
			full.fire()
		}
		mu.Unlock()

		s.wait(full.ch)

		mu.Lock()
		inFlight--
		mu.Unlock()

		return basicHandler(conn, args)
	})

	opts := longOptions(s.addr())
	opts.PoolSize = poolSize

	p := NewPool(opts)
	defer p.Close()

	var wg sync.WaitGroup

	errs := make([]error, callers)

	for i := 0; i < callers; i++ {
		wg.Add(1)

		go func(i int) {
			defer wg.Done()

			arg := "caller" + strconv.Itoa(i)

			v, err := p.Do("ECHO", arg)
			if err == nil && v.Str != arg {
				err = fmt.Errorf("got %#v, want %q", v, arg)
			}

			errs[i] = err
		}(i)
	}

	wg.Wait()

	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}

	if n := s.acceptedCount(); n != poolSize {
		t.Fatalf("server accepted %d connections, want %d", n, poolSize)
	}

	mu.Lock()
	defer mu.Unlock()

	if maxSeen > poolSize {
		t.Fatalf("%d commands in flight at once, PoolSize is %d", maxSeen, poolSize)
	}

	if p.openCount() != poolSize || p.idleCount() != poolSize {
		t.Fatalf("after the calls: %d slots held, %d idle; want %d and %d", p.openCount(), p.idleCount(), poolSize, poolSize)
	}
}

func TestPoolExhausted(t *testing.T) {
	// PoolSize 1; the only connection is stuck in AUTH, so a second caller
	// gets ErrPoolTimeout after WaitTimeout instead of opening a second one.
	authStarted, release := newSignal(), newSignal()

	s := newServer(t)

	s.start(func(conn int, args []string) string {
		if args[0] == "AUTH" {
			authStarted.fire()
			s.wait(release.ch)
		}

		return basicHandler(conn, args)
	})

	p := NewPool(Options{Address: s.addr(), Password: "pass", PoolSize: 1, DialTimeout: failAfter, Timeout: failAfter, WaitTimeout: 50 * time.Millisecond})
	defer p.Close()

	first := make(chan error, 1)

	go func() {
		_, err := p.Do("PING")
		first <- err
	}()

	waitSignal(t, authStarted, "AUTH of the first connection")

	_, err := p.Do("PING")
	if !errors.Is(err, ErrPoolTimeout) {
		t.Fatalf("second caller: err = %v, want ErrPoolTimeout", err)
	}

	release.fire()

	select {
	case err := <-first:
		if errors.Is(err, ErrPoolTimeout) {
			t.Fatalf("first caller: %v", err)
		}
	case <-time.After(failAfter):
		t.Fatal("first caller did not return")
	}

	if n := s.acceptedCount(); n != 1 {
		t.Fatalf("server accepted %d connections, want 1", n)
	}
}

func TestPoolDiscardsBrokenConnection(t *testing.T) {
	cases := []struct {
		name    string
		reply   string // answer to BREAK
		timeout time.Duration
		check   func(t *testing.T, err error)
	}{
		{"protocol error", "?garbage\r\n", failAfter, func(t *testing.T, err error) {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		}},
		{"bound exceeded", "$99999999999\r\n", failAfter, func(t *testing.T, err error) {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		}},
		{"server closes", closeConn, failAfter, func(t *testing.T, err error) {
			var oe *net.OpError
			if !errors.Is(err, io.EOF) && !errors.As(err, &oe) {
				t.Fatalf("err = %v, want io.EOF or a *net.OpError", err)
			}
		}},
		{"no answer", "", 50 * time.Millisecond, func(t *testing.T, err error) {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("err = %v, want a net.Error with Timeout() true", err)
			}
		}},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, func(conn int, args []string) string {
				if args[0] == "BREAK" {
					return tc.reply
				}

				return basicHandler(conn, args)
			})

			p := NewPool(Options{Address: s.addr(), DialTimeout: failAfter, Timeout: tc.timeout, PoolSize: 1})
			defer p.Close()

			if v, err := doWithin(t, p, "BREAK"); err == nil {
				t.Fatalf("Do BREAK = %#v, want an error", v)
			} else {
				tc.check(t, err)
			}

			// The client closed the broken connection and freed its slot.
			s.waitGone(t, 1)

			if p.idleCount() != 0 || p.openCount() != 0 {
				t.Fatalf("after the failure: %d idle, %d slots held; want 0 and 0", p.idleCount(), p.openCount())
			}

			if tc.timeout < failAfter {
				return // a further call would race the short timeout
			}

			v, err := p.Do("PING")
			if err != nil || v.Str != "PONG" {
				t.Fatalf("Do PING after the failure = %#v, %v", v, err)
			}

			if n := s.acceptedCount(); n != 2 {
				t.Fatalf("server accepted %d connections, want 2 (broken one not reused)", n)
			}

			log := s.log()
			if last := log[len(log)-1]; last.conn != 2 {
				t.Fatalf("PING sent on connection %d, want 2", last.conn)
			}
		})
	}
}

func TestPoolSetupTimeout(t *testing.T) {
	// A server that accepts but never answers AUTH: the dial gives up.
	s := startServer(t, func(int, []string) string { return "" })

	p := NewPool(Options{Address: s.addr(), Password: "hunter2", DialTimeout: 50 * time.Millisecond, Timeout: failAfter, PoolSize: 1})
	defer p.Close()

	_, err := doWithin(t, p, "PING")

	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want a net.Error with Timeout() true", err)
	}

	if strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("err = %q contains the password", err)
	}

	s.waitGone(t, 1)

	if p.openCount() != 0 {
		t.Fatalf("%d slots held after a failed setup", p.openCount())
	}
}

func TestPoolClose(t *testing.T) {
	s := startServer(t, basicHandler)

	p := NewPool(longOptions(s.addr()))

	for i := 0; i < 2; i++ {
		if v, err := p.Do("PING"); err != nil || v.Str != "PONG" {
			t.Fatalf("Do = %#v, %v", v, err)
		}
	}

	p.Close()

	// The idle connection is closed by Close itself.
	s.waitGone(t, 1)

	if _, err := p.Do("PING"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}

	if _, err := p.Pipeline([][]string{{"PING"}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Pipeline after Close = %v, want ErrClosed", err)
	}

	p.Close() // twice is harmless

	if n := s.acceptedCount(); n != 1 {
		t.Fatalf("server accepted %d connections, want 1", n)
	}

	if p.openCount() != 0 || p.idleCount() != 0 {
		t.Fatalf("after Close: %d slots held, %d idle", p.openCount(), p.idleCount())
	}
}

func TestPoolCloseWithConnectionInUse(t *testing.T) {
	started, release := newSignal(), newSignal()

	s := newServer(t)

	s.start(func(conn int, args []string) string {
		if args[0] == "SLOW" {
			started.fire()
			s.wait(release.ch)

			return "+DONE\r\n"
		}

		return basicHandler(conn, args)
	})

	p := NewPool(longOptions(s.addr()))

	type result struct {
		v   Value
		err error
	}

	res := make(chan result, 1)

	go func() {
		v, err := p.Do("SLOW")
		res <- result{v, err}
	}()

	waitSignal(t, started, "SLOW reaching the server")

	p.Close()

	if _, err := p.Do("PING"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}

	release.fire()

	select {
	case r := <-res:
		if r.err != nil || r.v.Str != "DONE" {
			t.Fatalf("call in progress during Close = %#v, %v; want +DONE", r.v, r.err)
		}
	case <-time.After(failAfter):
		t.Fatal("call in progress did not return")
	}

	// Returned to a closed pool, the connection is closed, not kept.
	s.waitGone(t, 1)

	if p.openCount() != 0 || p.idleCount() != 0 {
		t.Fatalf("after Close: %d slots held, %d idle", p.openCount(), p.idleCount())
	}
}

// The rate limiter's call (DoInts) in progress during Close: it completes,
// and its connection is closed on return instead of going back to the pool.
func TestPoolCloseWithDoIntsInUse(t *testing.T) {
	started, release := newSignal(), newSignal()

	s := newServer(t)

	s.start(func(conn int, args []string) string {
		if args[0] == "SLOW" {
			started.fire()
			s.wait(release.ch)

			return "*2\r\n:1\r\n:2\r\n"
		}

		return basicHandler(conn, args)
	})

	p := NewPool(longOptions(s.addr()))

	type result struct {
		ints []int64
		err  error
	}

	res := make(chan result, 1)

	go func() {
		ints, _, err := p.DoInts("*1\r\n$4\r\nSLOW\r\n")
		res <- result{ints, err}
	}()

	waitSignal(t, started, "SLOW reaching the server")

	p.Close()
	release.fire()

	select {
	case r := <-res:
		if r.err != nil || len(r.ints) != 2 {
			t.Fatalf("call in progress during Close = %v, %v; want [1 2]", r.ints, r.err)
		}
	case <-time.After(failAfter):
		t.Fatal("call in progress did not return")
	}

	s.waitGone(t, 1)

	if p.openCount() != 0 || p.idleCount() != 0 {
		t.Fatalf("after Close: %d slots held, %d idle", p.openCount(), p.idleCount())
	}

	if _, _, err := p.DoInts("*1\r\n$4\r\nPING\r\n"); !errors.Is(err, ErrClosed) {
		t.Fatalf("DoInts after Close = %v, want ErrClosed", err)
	}
}

func TestPoolDefaults(t *testing.T) {
	p := NewPool(Options{Address: "127.0.0.1:1"})

	if p.opts.DialTimeout != 250*time.Millisecond || p.opts.Timeout != 100*time.Millisecond || p.opts.PoolSize != 16 || p.opts.WaitTimeout != DefaultWaitTimeout {
		t.Fatalf("defaults = %+v", p.opts)
	}

	if p.opts.Limits != DefaultLimits {
		t.Fatalf("limits = %+v, want DefaultLimits", p.opts.Limits)
	}

	lim := Limits{MaxLine: 64, MaxBulk: 128, MaxElements: 4, MaxDepth: 1}

	p = NewPool(Options{Address: "127.0.0.1:1", Limits: lim, PoolSize: 3, Timeout: time.Second})
	if p.opts.Limits != lim || p.opts.PoolSize != 3 || p.opts.Timeout != time.Second {
		t.Fatalf("explicit options replaced: %+v", p.opts)
	}
}

func TestPoolAppliesLimits(t *testing.T) {
	s := startServer(t, func(conn int, args []string) string {
		if args[0] == "BIG" {
			return bulk(strings.Repeat("x", 200))
		}

		return basicHandler(conn, args)
	})

	opts := longOptions(s.addr())
	opts.Limits = Limits{MaxLine: 64, MaxBulk: 128, MaxElements: 4, MaxDepth: 1}

	p := NewPool(opts)
	defer p.Close()

	if _, err := p.Do("BIG"); !errors.Is(err, ErrProtocol) {
		t.Fatalf("200-byte bulk with MaxBulk 128: err = %v, want ErrProtocol", err)
	}
}

// awaitErr returns what a call sent on ch, failing the test if that takes
// longer than failAfter.
func awaitErr(t *testing.T, ch <-chan error, what string) error {
	t.Helper()

	select {
	case err := <-ch:
		return err
	case <-time.After(failAfter):
		t.Fatalf("%s did not return within %s", what, failAfter)
		return nil
	}
}

// waitBlockedInGet waits until some goroutine is parked in the receive of
// (*Pool).wait, that is, waiting for a connection to become free.
func waitBlockedInGet(t *testing.T) {
	t.Helper()

	deadline := time.Now().Add(failAfter)
	buf := make([]byte, 1<<20)

	for time.Now().Before(deadline) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "[chan receive") && (strings.Contains(g, "redisresp.(*Pool).wait(") || strings.Contains(g, "redisresp.(*Pool).get(")) {
				return
			}
		}

		runtime.Gosched()
	}

	t.Fatal("no caller waiting for a connection")
}

// TestPoolCloseWhileWaiting: a caller that is waiting for a free connection
// when Close is called must fail with ErrClosed, not take the slot freed by
// the returning connection and run its command on a new one.
func TestPoolCloseWhileWaiting(t *testing.T) {
	started, release := newSignal(), newSignal()

	s := newServer(t)

	s.start(func(conn int, args []string) string {
		if args[0] == "SLOW" {
			started.fire()
			s.wait(release.ch)
		}

		return basicHandler(conn, args)
	})

	opts := longOptions(s.addr())
	opts.PoolSize = 1

	p := NewPool(opts)

	slow := make(chan error, 1)

	go func() {
		_, err := p.Do("SLOW")
		slow <- err
	}()

	waitSignal(t, started, "SLOW reaching the server")

	waiter := make(chan error, 1)

	go func() {
		_, err := p.Do("PING")
		waiter <- err
	}()

	waitBlockedInGet(t)

	p.Close()
	release.fire()

	if err := awaitErr(t, slow, "the call in progress"); err != nil {
		t.Fatalf("call in progress during Close: %v", err)
	}

	if err := awaitErr(t, waiter, "the caller waiting during Close"); !errors.Is(err, ErrClosed) {
		t.Errorf("caller waiting during Close: err = %v, want ErrClosed", err)
	}

	if n := s.acceptedCount(); n != 1 {
		t.Errorf("server accepted %d connections, want 1: the closed pool dialled (commands: %v)", n, s.log())
	}
}

func TestPartialLimitsTakeDefaultsForTheRest(t *testing.T) {
	p := NewPool(Options{Address: "127.0.0.1:1", Limits: Limits{MaxLine: 64}})

	want := DefaultLimits
	want.MaxLine = 64

	if p.opts.Limits != want {
		t.Fatalf("limits %+v, want %+v", p.opts.Limits, want)
	}
}

func (p *Pool) openCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()

	return p.open
}

func (p *Pool) idleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()

	return len(p.idle)
}

// TestPoolWakesEveryWaiter: with all connections busy, several callers wait;
// as the connections come back, every waiter gets one (no lost wake-up).
func TestPoolWakesEveryWaiter(t *testing.T) {
	release := newSignal()
	s := startServer(t, func(_ int, args []string) string {
		if args[0] == "SLOW" {
			<-release.ch
		}

		return "+OK\r\n"
	})
	// Runs before the server's stop (cleanups run last first), which waits
	// for the handlers: a failing test does not leave them blocked.
	t.Cleanup(release.fire)

	p := NewPool(Options{Address: s.addr(), PoolSize: 3, Timeout: 10 * time.Second})
	defer p.Close()

	var wg sync.WaitGroup

	errs := make(chan error, 9)

	for i := 0; i < 3; i++ {
		wg.Add(1)

		go func() {
			defer wg.Done()

			_, err := p.Do("SLOW")
			errs <- err
		}()
	}

	for deadline := time.Now().Add(failAfter); p.openCount() != 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections open after %s, want 3", p.openCount(), failAfter)
		}

		time.Sleep(time.Millisecond)
	}

	for i := 0; i < 6; i++ {
		wg.Add(1)

		go func() {
			defer wg.Done()

			_, err := p.Do("PING")
			errs <- err
		}()
	}

	release.fire()

	all := make(chan struct{})

	go func() {
		wg.Wait()
		close(all)
	}()

	select {
	case <-all:
	case <-time.After(failAfter):
		t.Fatalf("callers still waiting %s after the connections came back", failAfter)
	}

	close(errs)

	for err := range errs {
		if err != nil {
			t.Fatalf("a waiting caller failed: %v", err)
		}
	}
}
