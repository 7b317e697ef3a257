package redisresp

import (
	"errors"
	"net"
	"testing"
	"time"
)

// dialFake connects to a fake server that answers every command with reply.
func dialFake(t *testing.T, reply string) net.Conn {
	t.Helper()

	s := startServer(t, func(int, []string) string { return reply })

	nc, err := net.Dial("tcp", s.addr())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}

	t.Cleanup(func() { _ = nc.Close() })

	return nc
}

// TestConnIntsSendsACommandWhoseDeadlinePassedBeforeTheWrite: a caller that
// got the CPU back only after its deadline (a burst has more goroutines than
// cores) still sends its command and reads the reply; Redis was not slow.
func TestConnIntsSendsACommandWhoseDeadlinePassedBeforeTheWrite(t *testing.T) {
	c := NewConn(dialFake(t, ":42\r\n"), DefaultLimits)
	c.timeout = failAfter

	if n, ints := connInts(c, time.Now().Add(-time.Second), take); n != 42 || ints != nil || c.Err() != nil {
		t.Fatalf("connInts with its deadline passed: %d %v %v, want 42", n, ints, c.Err())
	}
}

// lateReads fails its first Read with a timeout, without reading, as Go does
// for a read started after the deadline.
type lateReads struct {
	net.Conn
	late bool
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

func (l *lateReads) Read(b []byte) (int, error) {
	if !l.late {
		l.late = true
		return 0, timeoutError{}
	}

	return l.Conn.Read(b)
}

// TestConnIntsReadsAReplyThatArrivedBeforeALateRead: a read that starts
// after the deadline, the reply already there, reads it.
func TestConnIntsReadsAReplyThatArrivedBeforeALateRead(t *testing.T) {
	for _, reply := range []string{":42\r\n", "*2\r\n:1\r\n:2\r\n"} {
		c := NewConn(&lateReads{Conn: dialFake(t, reply)}, DefaultLimits)

		n, ints := connInts(c, time.Now().Add(failAfter), take)
		if c.Err() != nil || (n != 42 && len(ints) != 2) {
			t.Fatalf("reply %q after a late read: %d %v %v", reply, n, ints, c.Err())
		}
	}
}

// TestConnIntsStillTimesOut: a server that never answers fails the call, the
// rescue notwithstanding.
func TestConnIntsStillTimesOut(t *testing.T) {
	c := NewConn(dialFake(t, ""), DefaultLimits)

	if n, ints := connInts(c, time.Now().Add(20*time.Millisecond), take); n >= 0 || ints != nil {
		t.Fatalf("connInts on a silent server: %d %v", n, ints)
	}

	var ne net.Error
	if err := c.Err(); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

// TestDoIntsRescuesLateWritesAndReads: Conn.DoInts, the general path's call,
// sends a command whose deadline passed before the write, and reads a reply
// that was there before a late read.
func TestDoIntsRescuesLateWritesAndReads(t *testing.T) {
	c := NewConn(dialFake(t, "*1\r\n:42\r\n"), DefaultLimits)
	c.timeout = failAfter

	if ints, serverErr, err := c.DoInts(time.Now().Add(-time.Second), take); err != nil || serverErr != "" || len(ints) != 1 || ints[0] != 42 {
		t.Fatalf("DoInts with its deadline passed: %v %q %v, want [42]", ints, serverErr, err)
	}

	c = NewConn(&lateReads{Conn: dialFake(t, "*1\r\n:42\r\n")}, DefaultLimits)

	if ints, _, err := c.DoInts(time.Now().Add(failAfter), take); err != nil || len(ints) != 1 || ints[0] != 42 {
		t.Fatalf("DoInts after a late read: %v %v, want [42]", ints, err)
	}
}
