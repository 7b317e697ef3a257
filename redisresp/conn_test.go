package redisresp

import (
	"bytes"
	"errors"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// fakeConn is a net.Conn that serves reads from a fixed input and records
// writes. It is not safe for concurrent use, like Conn itself.
type fakeConn struct {
	in          io.Reader
	out         bytes.Buffer
	reads       int
	writes      int
	closed      bool
	deadline    time.Time
	deadlineErr error // returned by SetDeadline when set
	writeErr    error // returned by Write when set
}

func (f *fakeConn) Read(p []byte) (int, error) {
	f.reads++
	if f.closed {
		return 0, net.ErrClosed
	}

	return f.in.Read(p)
}

func (f *fakeConn) Write(p []byte) (int, error) {
	f.writes++
	if f.closed {
		return 0, net.ErrClosed
	}

	if f.writeErr != nil {
		return 0, f.writeErr
	}

	return f.out.Write(p)
}

func (f *fakeConn) Close() error {
	f.closed = true
	return nil
}

func (f *fakeConn) LocalAddr() net.Addr  { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }
func (f *fakeConn) RemoteAddr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 6379} }

func (f *fakeConn) SetDeadline(t time.Time) error {
	if f.deadlineErr != nil {
		return f.deadlineErr
	}

	f.deadline = t

	return nil
}

func (f *fakeConn) SetReadDeadline(time.Time) error  { return nil }
func (f *fakeConn) SetWriteDeadline(time.Time) error { return nil }

// newFakeConn returns a Conn reading input. With oneByte, every Read returns
// at most one byte, so that every reply straddles many reads.
func newFakeConn(input string, lim Limits, oneByte bool) (*Conn, *fakeConn) {
	var in io.Reader = strings.NewReader(input)
	if oneByte {
		in = iotest.OneByteReader(in)
	}

	fc := &fakeConn{in: in}

	return NewConn(fc, lim), fc
}

// readModes runs a test with whole reads and with one-byte reads.
var readModes = []struct {
	name    string
	oneByte bool
}{
	{"whole", false},
	{"onebyte", true},
}

// farDeadline is a deadline no test reaches; fakeConn ignores it anyway.
func farDeadline() time.Time {
	return time.Now().Add(time.Hour)
}

// sameValue compares two values; a nil and an empty array are the same.
func sameValue(a, b Value) bool {
	if a.Kind != b.Kind || a.Str != b.Str || a.Int != b.Int || a.Null != b.Null || len(a.Array) != len(b.Array) {
		return false
	}

	for i := range a.Array {
		if !sameValue(a.Array[i], b.Array[i]) {
			return false
		}
	}

	return true
}

func TestConnParsesReplies(t *testing.T) {
	cases := []struct {
		name  string
		input string
		want  Value
	}{
		{"simple", "+OK\r\n", Value{Kind: KindSimple, Str: "OK"}},
		{"empty simple", "+\r\n", Value{Kind: KindSimple}},
		{"simple with spaces", "+hello world\r\n", Value{Kind: KindSimple, Str: "hello world"}},
		{"error", "-ERR msg\r\n", Value{Kind: KindError, Str: "ERR msg"}},
		{"wrongtype error", "-WRONGTYPE Operation against a key\r\n", Value{Kind: KindError, Str: "WRONGTYPE Operation against a key"}},
		{"integer", ":123\r\n", Value{Kind: KindInteger, Int: 123}},
		{"negative integer", ":-5\r\n", Value{Kind: KindInteger, Int: -5}},
		{"zero", ":0\r\n", Value{Kind: KindInteger, Int: 0}},
		{"max int64", ":9223372036854775807\r\n", Value{Kind: KindInteger, Int: 9223372036854775807}},
		{"min int64", ":-9223372036854775808\r\n", Value{Kind: KindInteger, Int: -9223372036854775808}},
		{"bulk", "$3\r\nfoo\r\n", Value{Kind: KindBulk, Str: "foo"}},
		{"empty bulk", "$0\r\n\r\n", Value{Kind: KindBulk, Str: ""}},
		{"null bulk", "$-1\r\n", Value{Kind: KindBulk, Null: true}},
		{"binary bulk", "$6\r\na\r\nb\x00\n\r\n", Value{Kind: KindBulk, Str: "a\r\nb\x00\n"}},
		{"bulk longer than a line", "$40\r\n" + strings.Repeat("x", 40) + "\r\n", Value{Kind: KindBulk, Str: strings.Repeat("x", 40)}},
		{"array of two", "*2\r\n$3\r\nfoo\r\n:1\r\n", Value{Kind: KindArray, Array: []Value{
			{Kind: KindBulk, Str: "foo"},
			{Kind: KindInteger, Int: 1},
		}}},
		{"nested array", "*2\r\n*2\r\n:1\r\n+a\r\n*1\r\n$-1\r\n", Value{Kind: KindArray, Array: []Value{
			{Kind: KindArray, Array: []Value{{Kind: KindInteger, Int: 1}, {Kind: KindSimple, Str: "a"}}},
			{Kind: KindArray, Array: []Value{{Kind: KindBulk, Null: true}}},
		}}},
		{"array with error and nulls", "*4\r\n:1\r\n-ERR inner\r\n$-1\r\n*-1\r\n", Value{Kind: KindArray, Array: []Value{
			{Kind: KindInteger, Int: 1},
			{Kind: KindError, Str: "ERR inner"},
			{Kind: KindBulk, Null: true},
			{Kind: KindArray, Null: true},
		}}},
		{"null array", "*-1\r\n", Value{Kind: KindArray, Null: true}},
		{"empty array", "*0\r\n", Value{Kind: KindArray}},
	}

	for _, mode := range readModes {
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				// A second reply follows each case: it must be read intact,
				// so the case consumed exactly its own bytes.
				c, fc := newFakeConn(tc.input+"+NEXT\r\n", DefaultLimits, mode.oneByte)

				got, err := c.Do(farDeadline(), "CMD")
				if err != nil {
					t.Fatalf("Do: %v", err)
				}

				if !sameValue(got, tc.want) {
					t.Fatalf("got %#v, want %#v", got, tc.want)
				}

				if got.IsError() != (tc.want.Kind == KindError) {
					t.Fatalf("IsError() = %v for %#v", got.IsError(), got)
				}

				if c.Err() != nil {
					t.Fatalf("Err() = %v after a good reply", c.Err())
				}

				next, err := c.Do(farDeadline(), "CMD")
				if err != nil || next.Kind != KindSimple || next.Str != "NEXT" {
					t.Fatalf("next reply = %#v, %v; want +NEXT", next, err)
				}

				if fc.closed {
					t.Fatal("connection closed after good replies")
				}
			})
		}
	}
}

func TestConnWritesCommands(t *testing.T) {
	long := strings.Repeat("v", 5000) // larger than the 4096-byte write buffer

	cases := []struct {
		name string
		args []string
		want string
	}{
		{"set", []string{"SET", "k", "v"}, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"},
		{"one word", []string{"PING"}, "*1\r\n$4\r\nPING\r\n"},
		{"empty argument", []string{"SET", "k", ""}, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"},
		{"binary argument", []string{"SET", "k", "a\r\nb"}, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$4\r\na\r\nb\r\n"},
		{"length in bytes", []string{"ECHO", "é"}, "*2\r\n$4\r\nECHO\r\n$2\r\né\r\n"},
		{"ten arguments", []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"},
			"*10\r\n$1\r\na\r\n$1\r\nb\r\n$1\r\nc\r\n$1\r\nd\r\n$1\r\ne\r\n$1\r\nf\r\n$1\r\ng\r\n$1\r\nh\r\n$1\r\ni\r\n$1\r\nj\r\n"},
		{"long argument", []string{"SET", "k", long}, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5000\r\n" + long + "\r\n"},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, fc := newFakeConn("+OK\r\n", DefaultLimits, false)

			deadline := time.Date(2030, 1, 2, 3, 4, 5, 6, time.UTC)

			v, err := c.Do(deadline, tc.args...)
			if err != nil {
				t.Fatalf("Do: %v", err)
			}

			if v.Kind != KindSimple || v.Str != "OK" {
				t.Fatalf("reply = %#v, want +OK", v)
			}

			if got := fc.out.String(); got != tc.want {
				t.Fatalf("wrote %q, want %q", got, tc.want)
			}

			if !fc.deadline.Equal(deadline) {
				t.Fatalf("deadline set to %v, want %v", fc.deadline, deadline)
			}
		})
	}
}

func TestConnPipeline(t *testing.T) {
	for _, mode := range readModes {
		t.Run(mode.name, func(t *testing.T) {
			c, fc := newFakeConn(":1\r\n$3\r\nbar\r\n-ERR no\r\n", DefaultLimits, mode.oneByte)

			cmds := [][]string{{"INCR", "a"}, {"GET", "b"}, {"BAD"}}

			replies, err := c.Pipeline(farDeadline(), cmds)
			if err != nil {
				t.Fatalf("Pipeline: %v", err)
			}

			want := []Value{
				{Kind: KindInteger, Int: 1},
				{Kind: KindBulk, Str: "bar"},
				{Kind: KindError, Str: "ERR no"},
			}

			if len(replies) != len(want) {
				t.Fatalf("got %d replies, want %d", len(replies), len(want))
			}

			for i := range want {
				if !sameValue(replies[i], want[i]) {
					t.Fatalf("reply %d = %#v, want %#v", i, replies[i], want[i])
				}
			}

			wantOut := "*2\r\n$4\r\nINCR\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n*1\r\n$3\r\nBAD\r\n"
			if got := fc.out.String(); got != wantOut {
				t.Fatalf("wrote %q, want %q", got, wantOut)
			}

			// All commands go out before any reply is read, in one write.
			if fc.writes != 1 {
				t.Fatalf("commands written in %d writes, want 1", fc.writes)
			}

			if c.Err() != nil {
				t.Fatalf("Err() = %v", c.Err())
			}
		})
	}
}

func TestConnErrorReplyKeepsConnection(t *testing.T) {
	c, fc := newFakeConn("-ERR unknown command 'FOO'\r\n+OK\r\n", DefaultLimits, false)

	v, err := c.Do(farDeadline(), "FOO")
	if err != nil {
		t.Fatalf("Do returned a Go error for a server error reply: %v", err)
	}

	if !v.IsError() || v.Str != "ERR unknown command 'FOO'" {
		t.Fatalf("reply = %#v, want error value", v)
	}

	if c.Err() != nil || fc.closed {
		t.Fatalf("connection unusable after an error reply: Err() = %v, closed = %v", c.Err(), fc.closed)
	}

	v, err = c.Do(farDeadline(), "PING")
	if err != nil || v.Kind != KindSimple || v.Str != "OK" {
		t.Fatalf("next Do = %#v, %v; want +OK", v, err)
	}

	if want := "*1\r\n$3\r\nFOO\r\n*1\r\n$4\r\nPING\r\n"; fc.out.String() != want {
		t.Fatalf("wrote %q, want %q", fc.out.String(), want)
	}
}

// smallLimits make every bound easy to reach.
var smallLimits = Limits{MaxLine: 16, MaxBulk: 32, MaxElements: 8, MaxDepth: 2}

func TestConnProtocolErrors(t *testing.T) {
	cases := []struct {
		name  string
		input string
	}{
		{"unknown type byte", "?x\r\n"},
		{"unknown type byte in array", "*2\r\n:1\r\n!x\r\n"},
		{"empty line", "\r\n"},
		{"missing CR", "+OK\n"},
		{"missing CR in array", "*1\r\n+OK\n"},
		{"lone LF", "\n"},
		{"non-numeric integer", ":12a\r\n"},
		{"empty integer", ":\r\n"},
		{"integer with space", ":1 \r\n"},
		{"integer overflow", ":9223372036854775808\r\n"},
		{"non-numeric bulk length", "$abc\r\n"},
		{"huge bulk length", "$999999999999\r\n"},
		{"bulk one over MaxBulk", "$33\r\n" + strings.Repeat("x", 33) + "\r\n"},
		{"bulk bytes over MaxBulk in total", "*2\r\n$20\r\n" + strings.Repeat("a", 20) + "\r\n$20\r\n" + strings.Repeat("b", 20) + "\r\n"},
		{"negative bulk length", "$-2\r\n"},
		{"very negative bulk length", "$-9223372036854775808\r\n"},
		{"bulk not terminated by CRLF", "$3\r\nfooXY\r\n"},
		{"bulk terminated by LF CR", "$3\r\nfoo\n\r"},
		{"non-numeric array length", "*x\r\n"},
		{"negative array length", "*-2\r\n"},
		{"array longer than MaxElements", "*9\r\n"},
		{"huge array length", "*999999999999\r\n"},
		{"elements over MaxElements across nesting", "*2\r\n*3\r\n:1\r\n:2\r\n:3\r\n*3\r\n:4\r\n:5\r\n:6\r\n"},
		{"scalar over MaxElements after a full nested array", "*2\r\n*6\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n"},
		{"nesting deeper than MaxDepth", "*1\r\n*1\r\n*1\r\n:1\r\n"},
		{"line longer than MaxLine", "+" + strings.Repeat("a", 20) + "\r\n"},
		{"line one over MaxLine", "+" + strings.Repeat("a", 14) + "\r\n"},
		{"error line longer than MaxLine", "-ERR " + strings.Repeat("e", 40) + "\r\n"},
		{"integer line longer than MaxLine", ":" + strings.Repeat("1", 30) + "\r\n"},
		{"length line longer than MaxLine", "$" + strings.Repeat("0", 30) + "1\r\nx\r\n"},
	}

	for _, mode := range readModes {
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				c, fc := newFakeConn(tc.input, smallLimits, mode.oneByte)

				v, err := c.Do(farDeadline(), "CMD")
				if err == nil {
					t.Fatalf("Do succeeded with %#v", v)
				}

				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("error %v does not wrap ErrProtocol", err)
				}

				assertBroken(t, c, fc, err)
			})
		}
	}
}

// assertBroken checks that c was closed by err and that a further call fails
// with it without any I/O.
func assertBroken(t *testing.T, c *Conn, fc *fakeConn, err error) {
	t.Helper()

	if c.Err() == nil {
		t.Fatal("Err() = nil after a failed call")
	}

	if !fc.closed {
		t.Fatal("underlying connection not closed after a failed call")
	}

	reads, writes := fc.reads, fc.writes

	_, err2 := c.Do(farDeadline(), "PING")
	if err2 == nil {
		t.Fatal("Do on a broken connection succeeded")
	}

	if err2.Error() != err.Error() {
		t.Fatalf("later Do returned %v, want the error that broke the connection (%v)", err2, err)
	}

	if _, err3 := c.Pipeline(farDeadline(), [][]string{{"PING"}}); err3 == nil {
		t.Fatal("Pipeline on a broken connection succeeded")
	}

	if fc.reads != reads || fc.writes != writes {
		t.Fatalf("broken connection did I/O: reads %d -> %d, writes %d -> %d", reads, fc.reads, writes, fc.writes)
	}
}

func TestConnWithinLimits(t *testing.T) {
	// Each input sits exactly on a bound of smallLimits and must be accepted.
	cases := []struct {
		name  string
		input string
	}{
		{"line of MaxLine bytes", "+" + strings.Repeat("a", 13) + "\r\n"},
		{"bulk of MaxBulk bytes", "$32\r\n" + strings.Repeat("x", 32) + "\r\n"},
		{"bulk bytes summing to MaxBulk", "*2\r\n$16\r\n" + strings.Repeat("a", 16) + "\r\n$16\r\n" + strings.Repeat("b", 16) + "\r\n"},
		{"MaxElements values", "*7\r\n:1\r\n:2\r\n:3\r\n:4\r\n:5\r\n:6\r\n:7\r\n"},
		{"MaxElements values nested", "*2\r\n*2\r\n:1\r\n:2\r\n*2\r\n:3\r\n:4\r\n"},
		{"values at MaxDepth", "*1\r\n*1\r\n:1\r\n"},
	}

	for _, mode := range readModes {
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				c, _ := newFakeConn(tc.input, smallLimits, mode.oneByte)

				if _, err := c.Do(farDeadline(), "CMD"); err != nil {
					t.Fatalf("Do: %v", err)
				}

				if c.Err() != nil {
					t.Fatalf("Err() = %v", c.Err())
				}
			})
		}
	}
}

func TestConnLimitsResetPerReply(t *testing.T) {
	// Each reply uses the whole budget; the budget is per reply, not per connection.
	one := "*2\r\n$15\r\n" + strings.Repeat("a", 15) + "\r\n$15\r\n" + strings.Repeat("b", 15) + "\r\n"
	c, _ := newFakeConn(one+one+one, smallLimits, false)

	replies, err := c.Pipeline(farDeadline(), [][]string{{"A"}, {"B"}, {"C"}})
	if err != nil {
		t.Fatalf("Pipeline: %v", err)
	}

	if len(replies) != 3 {
		t.Fatalf("got %d replies", len(replies))
	}
}

// runtimeMem samples the bytes allocated so far by the process.
type runtimeMem struct{ total uint64 }

func (m *runtimeMem) read() {
	var s runtime.MemStats

	runtime.ReadMemStats(&s)
	m.total = s.TotalAlloc
}

func TestConnHugeBulkDoesNotAllocate(t *testing.T) {
	// 100 MB announced with the default 1 MiB bound: rejected before allocating.
	var before, after runtimeMem

	before.read()

	c, fc := newFakeConn("$100000000\r\n", DefaultLimits, false)

	_, err := c.Do(farDeadline(), "GET", "k")
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("err = %v, want ErrProtocol", err)
	}

	after.read()

	if grew := after.total - before.total; grew > 16<<20 {
		t.Fatalf("allocated %d bytes for a rejected bulk", grew)
	}

	assertBroken(t, c, fc, err)
}

func TestConnShortReads(t *testing.T) {
	cases := []struct {
		name  string
		input string
	}{
		{"nothing", ""},
		{"mid line", "+OK"},
		{"before LF", "+OK\r"},
		{"mid integer", ":12"},
		{"mid length", "$5"},
		{"mid bulk", "$5\r\nab"},
		{"bulk without CRLF", "$3\r\nfoo"},
		{"bulk without LF", "$3\r\nfoo\r"},
		{"array missing elements", "*2\r\n:1\r\n"},
		{"array with no elements sent", "*1\r\n"},
		{"nested array cut", "*2\r\n*2\r\n:1\r\n"},
	}

	for _, mode := range readModes {
		for _, tc := range cases {
			t.Run(mode.name+"/"+tc.name, func(t *testing.T) {
				c, fc := newFakeConn(tc.input, DefaultLimits, mode.oneByte)

				v, err := c.Do(farDeadline(), "CMD")
				if err == nil {
					t.Fatalf("Do succeeded with %#v", v)
				}

				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("error %v wraps neither io.EOF nor io.ErrUnexpectedEOF", err)
				}

				assertBroken(t, c, fc, err)
			})
		}
	}
}

func TestConnShortReadInPipeline(t *testing.T) {
	c, fc := newFakeConn("+OK\r\n:1\r\n", DefaultLimits, false)

	replies, err := c.Pipeline(farDeadline(), [][]string{{"A"}, {"B"}, {"C"}})
	if err == nil {
		t.Fatalf("Pipeline succeeded with %d replies for 3 commands and 2 replies", len(replies))
	}

	if replies != nil {
		t.Fatalf("partial replies returned with error: %#v", replies)
	}

	assertBroken(t, c, fc, err)
}

func TestConnSetDeadlineError(t *testing.T) {
	c, fc := newFakeConn("+OK\r\n", DefaultLimits, false)
	fc.deadlineErr = errors.New("deadline refused")

	_, err := c.Do(farDeadline(), "PING")
	if !errors.Is(err, fc.deadlineErr) {
		t.Fatalf("err = %v, want it to wrap %v", err, fc.deadlineErr)
	}

	if fc.out.Len() != 0 {
		t.Fatalf("wrote %q after SetDeadline failed", fc.out.String())
	}

	assertBroken(t, c, fc, err)
}

func TestConnWriteError(t *testing.T) {
	c, fc := newFakeConn("+OK\r\n", DefaultLimits, false)
	fc.writeErr = errors.New("broken pipe")

	_, err := c.Do(farDeadline(), "PING")
	if !errors.Is(err, fc.writeErr) {
		t.Fatalf("err = %v, want it to wrap %v", err, fc.writeErr)
	}

	if fc.reads != 0 {
		t.Fatalf("read %d times after the write failed", fc.reads)
	}

	assertBroken(t, c, fc, err)
}

func TestConnReadTimeout(t *testing.T) {
	// A real connection whose peer never answers: the deadline ends the call.
	client, server := net.Pipe()
	defer server.Close()

	go func() {
		// Drain the command so that the write completes; never answer.
		_, _ = io.Copy(io.Discard, server)
	}()

	c := NewConn(client, DefaultLimits)

	done := make(chan error, 1)

	go func() {
		_, err := c.Do(time.Now().Add(50*time.Millisecond), "PING")
		done <- err
	}()

	var err error

	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Do did not return: deadline not applied")
	}

	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want a net.Error with Timeout() true", err)
	}

	if c.Err() == nil {
		t.Fatal("Err() = nil after a timeout")
	}

	if _, err := c.Do(farDeadline(), "PING"); err == nil {
		t.Fatal("Do after a timeout succeeded")
	}
}

func TestConnClose(t *testing.T) {
	c, fc := newFakeConn("+OK\r\n", DefaultLimits, false)

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	if !fc.closed {
		t.Fatal("underlying connection not closed")
	}

	if !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("Err() = %v, want ErrClosed", c.Err())
	}

	if _, err := c.Do(farDeadline(), "PING"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close = %v, want ErrClosed", err)
	}

	if fc.reads != 0 || fc.writes != 0 {
		t.Fatalf("closed connection did I/O: %d reads, %d writes", fc.reads, fc.writes)
	}
}

func TestConnCloseKeepsFirstError(t *testing.T) {
	c, _ := newFakeConn("?\r\n", DefaultLimits, false)

	_, err := c.Do(farDeadline(), "PING")
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("err = %v, want ErrProtocol", err)
	}

	_ = c.Close()

	if !errors.Is(c.Err(), ErrProtocol) {
		t.Fatalf("Err() after Close = %v, want the protocol error kept", c.Err())
	}
}

func TestConnTinyMaxLineRaised(t *testing.T) {
	// MaxLine below 16 is raised to 16, the smallest bufio buffer.
	c, _ := newFakeConn("+"+strings.Repeat("a", 13)+"\r\n", Limits{MaxLine: 4, MaxBulk: 8, MaxElements: 2, MaxDepth: 1}, false)

	v, err := c.Do(farDeadline(), "PING")
	if err != nil || v.Str != strings.Repeat("a", 13) {
		t.Fatalf("Do = %#v, %v", v, err)
	}
}

func TestValueString(t *testing.T) {
	cases := []struct {
		v       Value
		want    string
		isError bool
	}{
		{Value{Kind: KindSimple, Str: "OK"}, "OK", false},
		{Value{Kind: KindError, Str: "ERR x"}, "ERR x", true},
		{Value{Kind: KindInteger, Int: -42}, "-42", false},
		{Value{Kind: KindBulk, Str: "foo"}, "foo", false},
		{Value{Kind: KindBulk, Null: true}, "(nil)", false},
		{Value{Kind: KindArray, Array: []Value{{}, {}, {}}}, "array(3)", false},
	}

	for _, tc := range cases {
		if got := tc.v.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.v, got, tc.want)
		}

		if got := tc.v.IsError(); got != tc.isError {
			t.Errorf("%#v.IsError() = %v, want %v", tc.v, got, tc.isError)
		}
	}
}

// TestConnIntsReadsAsRecvIntsDoes: connInts writes its command and then
// reads the reply with recvInts's statements written out, since a call more
// costs allocations on the request path under Yaegi; the two copies stay
// one text.
func TestConnIntsReadsAsRecvIntsDoes(t *testing.T) {
	body := func(file, name string) []ast.Stmt {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}

		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Name.Name == name {
				return fn.Body.List
			}
		}

		t.Fatalf("%s: no func %s", file, name)

		return nil
	}

	text := func(stmts []ast.Stmt) string {
		var b strings.Builder
		for _, s := range stmts {
			_ = printer.Fprint(&b, token.NewFileSet(), s)
			b.WriteString("\n")
		}

		return b.String()
	}

	// recvInts: the c.err check, then the read; connInts: the c.err
	// check, the deadline, the write, then the same read.
	recv, conn := body("pair.go", "recvInts"), body("conn.go", "connInts")
	if len(conn) < 3 || len(recv) < 1 {
		t.Fatalf("connInts has %d statements, recvInts %d", len(conn), len(recv))
	}

	if got, want := text(conn[3:]), text(recv[1:]); got != want {
		t.Errorf("connInts reads its reply as\n%s\nrecvInts as\n%s", got, want)
	}
}
