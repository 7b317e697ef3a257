package redisresp

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakePrimary answers ROLE with role and TAKE with two integers, or with
// reply when set.
type fakePrimary struct {
	*fakeServer

	mu    sync.Mutex
	role  string
	reply string
}

func startPrimary(t *testing.T) *fakePrimary {
	p := &fakePrimary{fakeServer: newServer(t), role: "master"}
	p.start(func(_ int, args []string) string {
		p.mu.Lock()
		defer p.mu.Unlock()

		switch args[0] {
		case "ROLE":
			return "*3\r\n" + bulk(p.role) + ":0\r\n*0\r\n"
		case "TAKE":
			if p.reply != "" {
				return p.reply
			}

			return "*2\r\n:1\r\n:2\r\n"
		}

		return basicHandler(0, args)
	})

	return p
}

func (p *fakePrimary) set(role, reply string) {
	p.mu.Lock()
	p.role, p.reply = role, reply
	p.mu.Unlock()
}

func (p *fakePrimary) count(name string) int {
	n := 0
	for _, c := range p.log() {
		if c.args[0] == name {
			n++
		}
	}

	return n
}

// fakeSentinel names *primary for the group "mymaster".
func startSentinel(t *testing.T, primary *string, mu *sync.Mutex) *fakePrimary {
	s := &fakePrimary{fakeServer: newServer(t)}
	s.start(func(_ int, args []string) string {
		if len(args) == 3 && args[0] == "SENTINEL" && args[1] == "get-master-addr-by-name" && args[2] == "mymaster" {
			mu.Lock()
			defer mu.Unlock()

			host, port, _ := strings.Cut(*primary, ":")

			return "*2\r\n" + bulk(host) + bulk(port)
		}

		if args[0] == "SENTINEL" {
			return "*-1\r\n"
		}

		if args[0] == "SUBSCRIBE" && len(args) == 2 {
			return "*3\r\n" + bulk("subscribe") + bulk(args[1]) + ":1\r\n"
		}

		return basicHandler(0, args)
	})

	return s
}

const take = "*1\r\n$4\r\nTAKE\r\n"

func TestSentinelFindsThePrimaryOnceAndAgainAfterAFailure(t *testing.T) {
	a, b := startPrimary(t), startPrimary(t)

	var mu sync.Mutex
	current := a.addr()
	sentinel := startSentinel(t, &current, &mu)

	opts := longOptions("")
	opts.Sentinel = &SentinelOptions{MasterName: "mymaster", Addresses: []string{closedAddr(t), sentinel.addr()}}
	s := NewSentinel(opts)
	defer s.Close()

	if n := sentinel.acceptedCount(); n != 0 {
		t.Fatalf("NewSentinel connected %d times", n)
	}

	for i := 0; i < 5; i++ {
		if ints, serverErr, err := s.DoInts(take); err != nil || serverErr != "" || len(ints) != 2 {
			t.Fatalf("call %d: %v %q %v", i, ints, serverErr, err)
		}
	}

	waitFor(t, "the watcher's SUBSCRIBE", func() bool { return sentinel.count("SUBSCRIBE") == 1 })

	if n := sentinel.asked(); n != 1 {
		t.Fatalf("5 calls asked the sentinels %d times, want once", n)
	}

	if n := a.count("ROLE"); n != 1 {
		t.Fatalf("the primary's one connection was checked with ROLE %d times", n)
	}

	if s.Primary() != a.addr() {
		t.Fatalf("primary %q, want %q", s.Primary(), a.addr())
	}

	// Failover: a is demoted and answers READONLY; the sentinels name b.
	a.set("slave", "-READONLY You can't write against a read only replica.\r\n")
	mu.Lock()
	current = b.addr()
	mu.Unlock()

	// The READONLY reply sends the call to the new primary at once.
	if ints, serverErr, err := s.DoInts(take); err != nil || serverErr != "" || len(ints) != 2 {
		t.Fatalf("call on the demoted primary: %v %q %v, want it run again on the primary the sentinels name", ints, serverErr, err)
	}

	if n := sentinel.asked(); n != 2 {
		t.Fatalf("the sentinels were asked %d times, want twice (start, failover)", n)
	}

	if s.Primary() != b.addr() || b.count("TAKE") != 1 {
		t.Fatalf("primary %q with %d calls, want %q with 1", s.Primary(), b.count("TAKE"), b.addr())
	}

	// A sentinel still naming a replica: the ROLE check refuses it.
	b.set("slave", "")

	if err := b.dropConnections(); err != nil {
		t.Fatal(err)
	}

	if _, _, err := s.DoInts(take); err == nil {
		t.Fatal("a call on the dropped connection succeeded")
	}

	if _, _, err := s.DoInts(take); !errors.Is(err, ErrNotPrimary) {
		t.Fatalf("a replica named by the sentinels: %v, want ErrNotPrimary", err)
	}

	if n := b.count("TAKE"); n != 1 {
		t.Fatalf("the replica ran %d calls, want 1 (from when it was the primary)", n)
	}
}

// TestSentinelScriptIntsDropsALostPrimary: the rate limiter's call on a
// Sentinel's primary finds it once, and after a READONLY reply finds the new
// one, as DoInts does.
func TestSentinelScriptIntsDropsALostPrimary(t *testing.T) {
	a, b := startPrimary(t), startPrimary(t)

	var mu sync.Mutex
	current := a.addr()
	sentinel := startSentinel(t, &current, &mu)

	opts := longOptions("")
	opts.Sentinel = &SentinelOptions{MasterName: "mymaster", Addresses: []string{sentinel.addr()}}
	s := NewSentinel(opts)
	defer s.Close()

	for i := 0; i < 3; i++ {
		if n, ints, err := ScriptInts(nil, s, Call{}, take); err != nil || n != -1 || len(ints) != 2 {
			t.Fatalf("call %d: %d %v %v", i, n, ints, err)
		}
	}

	if n := sentinel.asked(); n != 1 {
		t.Fatalf("3 calls asked the sentinels %d times, want once", n)
	}

	// a is demoted and answers READONLY before the sentinels switch: the
	// call fails, the sentinels asked once more, not a again.
	a.set("slave", "-READONLY You can't write against a read only replica.\r\n")

	if _, _, err := ScriptInts(nil, s, Call{}, take); !errors.Is(err, ErrServer) || !strings.Contains(err.Error(), "READONLY") {
		t.Fatalf("call on the demoted primary the sentinels still name: %v, want its READONLY", err)
	}

	if n, calls := sentinel.asked(), a.count("TAKE"); n != 2 || calls != 4 {
		t.Fatalf("the sentinels were asked %d times and a ran %d calls, want 2 and 4 (no retry on the server that refused)", n, calls)
	}

	// The sentinels name b: a READONLY reply sends the call there at once,
	// within the call (the rate limiter does not fall back to memory).
	mu.Lock()
	current = b.addr()
	mu.Unlock()

	a.set("slave", "-READONLY You can't write against a read only replica.\r\n")

	if _, ints, err := ScriptInts(nil, s, Call{}, take); err != nil || len(ints) != 2 {
		t.Fatalf("call on the demoted primary after the failover: %v %v, want it run again on the new primary", ints, err)
	}

	if s.Primary() != b.addr() || b.count("TAKE") != 1 {
		t.Fatalf("primary %q with %d calls after %d questions to the sentinels, want %q with 1",
			s.Primary(), b.count("TAKE"), sentinel.asked(), b.addr())
	}
}

func TestSentinelNamesNoPrimary(t *testing.T) {
	var mu sync.Mutex
	current := ""
	sentinel := startSentinel(t, &current, &mu)

	opts := longOptions("")
	opts.Sentinel = &SentinelOptions{MasterName: "other", Addresses: []string{sentinel.addr()}}
	s := NewSentinel(opts)
	defer s.Close()

	if _, _, err := s.DoInts(take); !errors.Is(err, ErrNoPrimary) || !strings.Contains(err.Error(), `"other"`) {
		t.Fatalf("unknown group: %v", err)
	}

	s.Close()

	if _, _, err := s.DoInts(take); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}

// dropConnections closes the server's side of every connection, as a crash would.
func (s *fakeServer) dropConnections() error {
	s.mu.Lock()
	defer s.mu.Unlock()

	for _, nc := range s.conns {
		_ = nc.Close()
	}

	return nil
}

// asked counts the SENTINEL commands of connections that did not subscribe:
// the discoveries, without the watcher's.
func (p *fakePrimary) asked() int {
	// A watcher pipelines its question and SUBSCRIBE, which the server logs
	// one after the other: give a connection that asked a moment to show
	// it is a watcher.
	deadline := time.Now().Add(200 * time.Millisecond)

	for {
		watchers := map[int]bool{}
		log := p.log()

		for _, c := range log {
			if c.args[0] == "SUBSCRIBE" {
				watchers[c.conn] = true
			}
		}

		n, last := 0, map[int]string{}
		for _, c := range log {
			last[c.conn] = c.args[0]
			if c.args[0] == "SENTINEL" && !watchers[c.conn] {
				n++
			}
		}

		pending := false
		for conn, cmd := range last {
			pending = pending || cmd == "SENTINEL" && !watchers[conn]
		}

		if !pending || time.Now().After(deadline) {
			return n
		}

		time.Sleep(5 * time.Millisecond) // polling the server's log, not a window
	}
}

// waitFor polls cond until it holds, failing the test after failAfter.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(failAfter)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within %s", what, failAfter)
		}

		time.Sleep(time.Millisecond)
	}
}

// A failover that leaves the old primary up fails no call: the watcher moves
// calls to the new primary when the sentinels announce the switch.
func TestSentinelFollowsSwitchMaster(t *testing.T) {
	a, b := startPrimary(t), startPrimary(t)

	var mu sync.Mutex
	current := a.addr()
	sentinel := startSentinel(t, &current, &mu)

	opts := longOptions("")
	opts.Sentinel = &SentinelOptions{MasterName: "mymaster", Addresses: []string{sentinel.addr()}}
	s := NewSentinel(opts)

	var switches []string
	var smu sync.Mutex
	s.OnSwitch = func(from, to string) {
		smu.Lock()
		switches = append(switches, from+">"+to)
		smu.Unlock()
	}

	if _, _, err := s.DoInts(take); err != nil {
		t.Fatal(err)
	}

	watcher := switchWatcher(t, sentinel)

	mu.Lock()
	current = b.addr()
	mu.Unlock()

	ah, ap, _ := strings.Cut(a.addr(), ":")
	bh, bp, _ := strings.Cut(b.addr(), ":")
	msg := "other 1.2.3.4 1 5.6.7.8 2" // another group's switch changes nothing

	for _, m := range []string{msg, "mymaster " + ah + " " + ap + " " + bh + " " + bp} {
		sentinel.mu.Lock()
		nc := sentinel.conns[watcher-1]
		sentinel.mu.Unlock()

		if _, err := nc.Write([]byte("*3\r\n" + bulk("message") + bulk("+switch-master") + bulk(m))); err != nil {
			t.Fatal(err)
		}
	}

	waitFor(t, "the switch to "+b.addr(), func() bool { return s.Primary() == b.addr() })

	if _, serverErr, err := s.DoInts(take); err != nil || serverErr != "" || b.count("TAKE") != 1 || a.count("TAKE") != 1 {
		t.Fatalf("after the switch: %q %v; calls on a %d, on b %d", serverErr, err, a.count("TAKE"), b.count("TAKE"))
	}

	// use reports a switch after it made the new primary current.
	var got string
	waitFor(t, "OnSwitch", func() bool {
		smu.Lock()
		got = strings.Join(switches, ",")
		smu.Unlock()

		return got != ""
	})

	if want := a.addr() + ">" + b.addr(); got != want {
		t.Fatalf("OnSwitch calls %q, want %q", got, want)
	}

	s.Close()
	sentinel.waitGone(t, watcher)
}

// TestSentinelScriptIntsDropsAPrimaryWhoseConnectionFailed: a call whose
// connection to the primary fails drops that primary, so the next call asks
// the sentinels again and reaches the one they name now; a pool merely busy
// (ErrPoolTimeout) says nothing of the primary and keeps it.
func TestSentinelScriptIntsDropsAPrimaryWhoseConnectionFailed(t *testing.T) {
	a, b := startPrimary(t), startPrimary(t)

	var mu sync.Mutex
	current := a.addr()
	sentinel := startSentinel(t, &current, &mu)

	opts := longOptions("")
	opts.Sentinel = &SentinelOptions{MasterName: "mymaster", Addresses: []string{sentinel.addr()}}
	s := NewSentinel(opts)
	defer s.Close()

	if _, ints, err := ScriptInts(nil, s, Call{}, take); err != nil || len(ints) != 2 {
		t.Fatalf("first call: %v %v", ints, err)
	}

	// a goes away mid-call (the connection closes); the sentinels name b.
	a.set("master", closeConn)
	mu.Lock()
	current = b.addr()
	mu.Unlock()

	if _, _, err := ScriptInts(nil, s, Call{}, take); err == nil || errors.Is(err, ErrServer) {
		t.Fatalf("call on the lost primary: %v, want its connection's failure", err)
	}

	if _, ints, err := ScriptInts(nil, s, Call{}, take); err != nil || len(ints) != 2 {
		t.Fatalf("call after the failure: %v %v", ints, err)
	}

	if s.Primary() != b.addr() || b.count("TAKE") != 1 || sentinel.asked() != 2 {
		t.Fatalf("primary %q with %d calls after %d questions to the sentinels, want %q with 1 after 2",
			s.Primary(), b.count("TAKE"), sentinel.asked(), b.addr())
	}

	if lostPrimary(fmt.Errorf("waiting 5s for one of 16 connections: %w", ErrPoolTimeout)) {
		t.Fatal("a busy pool is taken for a lost primary")
	}
}

// switchWatcher waits for a client's SUBSCRIBE to +switch-master on the
// sentinel and returns the number of that connection.
func switchWatcher(t *testing.T, sentinel *fakePrimary) int {
	t.Helper()

	watcher := 0
	waitFor(t, "the watcher's SUBSCRIBE", func() bool {
		for _, c := range sentinel.log() {
			if c.args[0] == "SUBSCRIBE" && c.args[1] == "+switch-master" {
				watcher = c.conn
				return true
			}
		}

		return false
	})

	return watcher
}
