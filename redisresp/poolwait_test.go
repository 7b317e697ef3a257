package redisresp

import (
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"
)

// waitForWaiters waits until n callers are queued for a connection.
func waitForWaiters(t *testing.T, p *Pool, n int) {
	t.Helper()

	for deadline := time.Now().Add(failAfter); ; {
		p.mu.Lock()
		got := p.waiting
		p.mu.Unlock()

		if got == n {
			return
		}

		if time.Now().After(deadline) {
			t.Fatalf("%d callers waiting after %s, want %d", got, failAfter, n)
		}

		time.Sleep(time.Millisecond)
	}
}

// TestPoolWaitOutlastsTimeout: a caller that finds every connection in use
// waits longer than Timeout, which bounds one call and not the queue before
// it: a busy pool is not an error (before WaitTimeout, the wait failed after
// Timeout with ErrPoolTimeout, and the rate limiter took Redis for down).
func TestPoolWaitOutlastsTimeout(t *testing.T) {
	s := startServer(t, basicHandler)

	p := NewPool(Options{Address: s.addr(), PoolSize: 1, DialTimeout: failAfter, Timeout: time.Millisecond, WaitTimeout: failAfter})
	defer p.Close()

	held, err := p.get()
	if err != nil {
		t.Fatalf("taking the only connection: %v", err)
	}

	start := time.Now()
	waiter := make(chan error, 1)

	// The waiter only takes a connection: its own call's Timeout is not
	// what this test is about.
	go func() {
		c, err := p.get()
		if err == nil {
			p.put(c)
		}
		waiter <- err
	}()

	waitForWaiters(t, p, 1)

	// Holding the connection for many times Timeout is the point of the test.
	for time.Since(start) < 50*p.opts.Timeout {
		time.Sleep(time.Millisecond)
	}

	p.put(held)

	if err := awaitErr(t, waiter, "the waiting caller"); err != nil {
		t.Fatalf("caller that waited %s for a connection: %v", time.Since(start), err)
	}
}

// TestPoolServesWaitersInOrder: connections returned to a busy pool go to the
// callers that have waited longest, and a newcomer queues behind them rather
// than taking the connection that was just returned.
func TestPoolServesWaitersInOrder(t *testing.T) {
	s := startServer(t, basicHandler)

	p := NewPool(Options{Address: s.addr(), PoolSize: 1, DialTimeout: failAfter, Timeout: failAfter, WaitTimeout: failAfter})
	defer p.Close()

	held, err := p.get()
	if err != nil {
		t.Fatalf("taking the only connection: %v", err)
	}

	const waiters = 4

	var wg sync.WaitGroup

	for i := 0; i < waiters; i++ {
		wg.Add(1)

		name := "W" + strconv.Itoa(i)

		go func() {
			defer wg.Done()

			if _, err := p.Do("ECHO", name); err != nil {
				t.Errorf("%s: %v", name, err)
			}
		}()

		waitForWaiters(t, p, i+1)
	}

	// The newcomer calls at once after the return, from the same goroutine:
	// with a free-for-all it finds the connection idle and goes first.
	p.put(held)

	if _, err := p.Do("ECHO", "NEWCOMER"); err != nil {
		t.Fatalf("newcomer: %v", err)
	}

	wg.Wait()

	var order []string

	for _, c := range s.log() {
		if c.args[0] == "ECHO" {
			order = append(order, c.args[1])
		}
	}

	want := []string{"W0", "W1", "W2", "W3", "NEWCOMER"}
	if !sameArgs(order, want) {
		t.Fatalf("served in order %v, want %v", order, want)
	}
}

// TestPoolFailedDialEndsEveryWait: when the dial a burst waits on fails, every
// waiter gets that failure at once, instead of each dialling in turn and
// keeping the burst waiting DialTimeout times the queue's length.
func TestPoolFailedDialEndsEveryWait(t *testing.T) {
	authStarted, release := newSignal(), newSignal()

	s := newServer(t)

	s.start(func(conn int, args []string) string {
		if args[0] == "AUTH" {
			authStarted.fire()
			s.wait(release.ch)

			return "-WRONGPASS invalid username-password pair\r\n"
		}

		return basicHandler(conn, args)
	})
	t.Cleanup(release.fire)

	p := NewPool(Options{Address: s.addr(), Password: "bad", PoolSize: 1, DialTimeout: failAfter, Timeout: failAfter, WaitTimeout: failAfter})
	defer p.Close()

	errs := make(chan error, 4)

	go func() {
		_, err := p.Do("PING")
		errs <- err
	}()

	waitSignal(t, authStarted, "AUTH of the first connection")

	for i := 0; i < 3; i++ {
		go func() {
			_, err := p.Do("PING")
			errs <- err
		}()

		waitForWaiters(t, p, i+1)
	}

	release.fire()

	for i := 0; i < 4; i++ {
		err := awaitErr(t, errs, "a caller")
		if err == nil || errors.Is(err, ErrPoolTimeout) {
			t.Fatalf("caller %d: err = %v, want the AUTH failure", i, err)
		}
	}

	if n := s.acceptedCount(); n != 1 {
		t.Fatalf("server accepted %d connections, want 1: the waiters dialled in turn", n)
	}
}

// TestPoolHandsABrokenConnectionsSlotToAWaiter: a broken connection returned
// to a busy pool is closed, and its slot goes to the oldest waiter, which
// dials a connection of its own.
func TestPoolHandsABrokenConnectionsSlotToAWaiter(t *testing.T) {
	s := startServer(t, basicHandler)

	p := NewPool(Options{Address: s.addr(), PoolSize: 1, DialTimeout: failAfter, Timeout: failAfter, WaitTimeout: failAfter})
	defer p.Close()

	held, err := p.get()
	if err != nil {
		t.Fatalf("taking the only connection: %v", err)
	}

	waiter := make(chan error, 1)

	go func() {
		_, err := p.Do("PING")
		waiter <- err
	}()

	waitForWaiters(t, p, 1)

	_ = held.Close()
	p.put(held)

	if err := awaitErr(t, waiter, "the waiting caller"); err != nil {
		t.Fatalf("waiter after a broken connection: %v", err)
	}

	if s.acceptedCount() != 2 || p.openCount() != 1 || p.idleCount() != 1 {
		t.Fatalf("%d connections accepted, %d open, %d idle; want 2, 1 and 1", s.acceptedCount(), p.openCount(), p.idleCount())
	}
}
