package redisresp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// Limits bound what one reply may hold. A reply over a limit is a protocol
// error and closes the connection.
type Limits struct {
	MaxLine     int // bytes in a status, error, integer or length line
	MaxBulk     int // bytes in one bulk string, and in all bulk strings of one reply
	MaxElements int // values in one reply, counting every nesting level
	MaxDepth    int // nesting of arrays
}

// DefaultLimits fit a rate limiter's replies with a wide margin.
var DefaultLimits = Limits{MaxLine: 4096, MaxBulk: 1 << 20, MaxElements: 1 << 16, MaxDepth: 8}

// Conn is one connection. It is not safe for concurrent use; Pool hands each
// Conn to one caller at a time. After an I/O or protocol error the Conn is
// closed and every later call returns that error.
type Conn struct {
	nc  net.Conn
	bw  *bufio.Writer
	rd  reader
	err error
	// serverErr is the error reply of the last call of ints, if any.
	serverErr string
	// timeout is a call's budget (Options.Timeout), for a command whose write
	// came too late to be sent (lateWrite); rescueGrace when 0.
	timeout time.Duration
}

// NewConn wraps an established connection (after TLS, before AUTH).
func NewConn(nc net.Conn, lim Limits) *Conn {
	if lim.MaxLine < 16 {
		lim.MaxLine = 16
	}

	return &Conn{
		nc: nc,
		bw: bufio.NewWriterSize(nc, 4096),
		rd: reader{br: bufio.NewReaderSize(nc, lim.MaxLine), lim: lim},
	}
}

// Err returns the error that closed the connection, or nil.
func (c *Conn) Err() error {
	return c.err
}

// Close closes the connection.
func (c *Conn) Close() error {
	if c.err == nil {
		c.err = ErrClosed
	}

	return c.nc.Close()
}

// Pipeline sends every command, then reads one reply per command, all before
// deadline. Server error replies come back as values.
func (c *Conn) Pipeline(deadline time.Time, cmds [][]string) ([]Value, error) {
	if c.err != nil {
		return nil, c.err
	}

	if err := c.nc.SetDeadline(deadline); err != nil {
		return nil, c.fail(fmt.Errorf("setting redis deadline: %w", err))
	}

	for _, cmd := range cmds {
		if err := writeCommand(c.bw, cmd); err != nil {
			return nil, c.fail(fmt.Errorf("writing redis command: %w", err))
		}
	}

	if err := c.bw.Flush(); err != nil {
		return nil, c.fail(fmt.Errorf("writing redis command: %w", err))
	}

	replies := make([]Value, len(cmds))

	for i := range replies {
		v, err := c.rd.readReply()
		if err != nil {
			return nil, c.fail(fmt.Errorf("reading redis reply: %w", err))
		}

		replies[i] = v
	}

	return replies, nil
}

// DoInts sends one encoded command whose reply must be an array of integers
// (or a server error, returned as its text), and reads the reply without
// building Values: under Yaegi that is most of the cost of a call. Any other
// reply is ErrUnexpected and closes the connection.
func (c *Conn) DoInts(deadline time.Time, cmd string) ([]int64, string, error) {
	if c.err != nil {
		return nil, "", c.err
	}

	if err := c.nc.SetDeadline(deadline); err != nil {
		return nil, "", c.fail(fmt.Errorf("setting redis deadline: %w", err))
	}

	if _, err := c.bw.WriteString(cmd); err != nil {
		return nil, "", c.fail(fmt.Errorf("writing redis command: %w", err))
	}

	if err := c.bw.Flush(); err != nil && !lateFlush(c, cmd, err) {
		return nil, "", c.fail(fmt.Errorf("writing redis command: %w", err))
	}

	// readInts, with lateRead's second look at a reply after a late read.
	b, err := c.rd.br.ReadSlice('\n')
	if err != nil && len(b) == 0 && c.late(err, rescueGrace) {
		b, err = c.rd.br.ReadSlice('\n')
	}

	line, err := c.rd.checkLine(b, err)
	if err != nil {
		return nil, "", c.fail(fmt.Errorf("reading redis reply: %w", err))
	}

	ints, serverErr, err := c.rd.intsFrom(line)
	if err != nil {
		return nil, "", c.fail(fmt.Errorf("reading redis reply: %w", err))
	}

	return ints, serverErr, nil
}

// lateFlush sends cmd again, unbuffered, when DoInts' flush of it timed out
// having sent nothing (see late), and reports whether it went.
func lateFlush(c *Conn, cmd string, err error) bool {
	grace := c.timeout
	if grace <= 0 {
		grace = rescueGrace
	}

	if !c.late(err, grace) {
		return false
	}

	// A failed Flush leaves its error in bw for good.
	c.bw.Reset(c.nc)
	_, err = io.WriteString(c.nc, cmd)

	return err == nil
}

// connInts is DoInts for ScriptInts, which runs it on every rate-limit call:
// a non-negative integer reply, returned as n with a nil slice, is read
// inline (a negative one is ErrUnexpected), a short
// array by shortArray, and everything else by intsOf (tierlimit's doc.go:
// frames). It returns no slice and n < 0 when the reply is neither: then
// either c.err is set (the connection is closed) or c.serverErr holds the
// server's error reply. The command is written to the connection itself: bw
// is empty between calls. Its read is recvInts's written out (a call more
// costs 5 allocations a request under Yaegi), held equal by
// TestConnIntsReadsAsRecvIntsDoes.
func connInts(c *Conn, deadline time.Time, cmd string) (int64, []int64) {
	if c.err != nil {
		return -1, nil
	}

	if err := c.nc.SetDeadline(deadline); err != nil {
		return -1, c.failed("setting redis deadline", err)
	}

	if _, err := io.WriteString(c.nc, cmd); err != nil {
		return lateWrite(c, cmd, err)
	}

	b, err := c.rd.br.ReadSlice('\n')
	if err != nil || len(b) < 4 || b[0] != KindInteger || b[len(b)-2] != '\r' {
		return lateRead(c, b, err)
	}

	n, err := strconv.ParseInt(string(b[1:len(b)-2]), 10, 64)
	if err != nil {
		return -1, c.failed("reading redis reply", badInteger(b, nil, c.rd.br.Size()))
	}

	if n < 0 {
		return -1, c.negative(n)
	}

	return n, nil
}

// rescueGrace is how long a call that missed its deadline without waiting
// for Redis gets to try again (late).
const rescueGrace = 10 * time.Millisecond

// late reports whether err is a timeout that says nothing of Redis, and then
// gives the call rescueGrace more. Under a burst a Traefik process has more
// runnable goroutines than cores, and one may get the CPU back only after its
// deadline: Go then fails the next write or read on the connection at once,
// before looking at it, though the reply may be there already. So a timeout
// of an operation that transferred nothing is tried once more: a reply that
// arrived is read at once, and a server that has not answered fails the call
// after rescueGrace. A write that timed out sent nothing: the connection's
// send buffer is empty between calls (each call reads its reply), so a
// command's write cannot block and only fails on a deadline already passed.
func (c *Conn) late(err error, grace time.Duration) bool {
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		return false
	}

	return c.nc.SetDeadline(time.Now().Add(grace)) == nil
}

// lateWrite finishes connInts when writing cmd failed with err. A command
// sent late gets a whole call's time: Redis has not seen it yet.
func lateWrite(c *Conn, cmd string, err error) (int64, []int64) {
	grace := c.timeout
	if grace <= 0 {
		grace = rescueGrace
	}

	if !c.late(err, grace) {
		return -1, c.failed("writing redis command", err)
	}

	if _, err := io.WriteString(c.nc, cmd); err != nil {
		return -1, c.failed("writing redis command", err)
	}

	b, err := c.rd.br.ReadSlice('\n')

	return lateRead(c, b, err)
}

// lateRead finishes connInts when the reply's first line, b (read with err),
// is not a non-negative integer: it reads it again once after a timeout that
// read nothing (late), and hands anything else to shortArray.
func lateRead(c *Conn, b []byte, err error) (int64, []int64) {
	if err != nil && len(b) == 0 && c.late(err, rescueGrace) {
		b, err = c.rd.br.ReadSlice('\n')
	}

	if err != nil || len(b) < 4 || b[0] != KindInteger || b[len(b)-2] != '\r' {
		return -1, c.shortArray(b, err)
	}

	n, err := strconv.ParseInt(string(b[1:len(b)-2]), 10, 64)
	if err != nil {
		return -1, c.failed("reading redis reply", badInteger(b, nil, c.rd.br.Size()))
	}

	if n < 0 {
		return -1, c.negative(n)
	}

	return n, nil
}

// shortArray is ints for a reply whose first line, b (read with err), is
// not an integer: the array of at most nine integers is read here, anything
// else by intsOf.
func (c *Conn) shortArray(b []byte, err error) []int64 {
	if err != nil || len(b) != 4 || b[0] != KindArray || b[1] < '0' || b[1] > '9' || b[2] != '\r' {
		return c.intsOf(b, err)
	}

	out := make([]int64, int(b[1]-'0'))

	for i := range out {
		b, err = c.rd.br.ReadSlice('\n')
		if err != nil || len(b) < 4 || b[0] != KindInteger || b[len(b)-2] != '\r' {
			return c.failed("reading redis reply", badInteger(b, err, c.rd.br.Size()))
		}

		v, err := strconv.ParseInt(string(b[1:len(b)-2]), 10, 64)
		if err != nil {
			return c.failed("reading redis reply", badInteger(b, nil, c.rd.br.Size()))
		}

		out[i] = v
	}

	return out
}

// negative closes the connection on a negative integer reply, for ints.
func (c *Conn) negative(n int64) []int64 {
	return c.failed("reading redis reply", fmt.Errorf("%w: negative integer %d", ErrUnexpected, n))
}

// failed closes the connection on an error while doing what, for ints.
func (c *Conn) failed(what string, err error) []int64 {
	_ = c.fail(fmt.Errorf("%s: %w", what, err))

	return nil
}

// intsOf is ints for a reply whose first line, b (read with err), is not
// that of an integer or a short array: an error reply, a longer array, or a
// failure.
func (c *Conn) intsOf(b []byte, err error) []int64 {
	line, err := c.rd.checkLine(b, err)
	if err != nil {
		_ = c.fail(fmt.Errorf("reading redis reply: %w", err))
		return nil
	}

	ints, serverErr, err := c.rd.intsFrom(line)
	if err != nil {
		_ = c.fail(fmt.Errorf("reading redis reply: %w", err))
		return nil
	}

	c.serverErr = serverErr

	return ints
}

// flush sets the deadline and writes what is buffered, for callers that
// pipeline encoded commands with bw.
func (c *Conn) flush(deadline time.Time) error {
	if c.err != nil {
		return c.err
	}

	if err := c.nc.SetDeadline(deadline); err != nil {
		return c.fail(fmt.Errorf("setting redis deadline: %w", err))
	}

	if err := c.bw.Flush(); err != nil {
		return c.fail(fmt.Errorf("writing redis command: %w", err))
	}

	return nil
}

// readInts reads one reply of a pipelined call (see DoInts).
func (c *Conn) readInts() ([]int64, string, error) {
	if c.err != nil {
		return nil, "", c.err
	}

	ints, serverErr, err := c.rd.readInts()
	if err != nil {
		return nil, "", c.fail(fmt.Errorf("reading redis reply: %w", err))
	}

	return ints, serverErr, nil
}

// Receive reads one reply that no command of this call asked for: a message
// of a subscribed connection. A timeout closes the connection, as any error.
func (c *Conn) Receive(deadline time.Time) (Value, error) {
	if c.err != nil {
		return Value{}, c.err
	}

	if err := c.nc.SetDeadline(deadline); err != nil {
		return Value{}, c.fail(fmt.Errorf("setting redis deadline: %w", err))
	}

	v, err := c.rd.readReply()
	if err != nil {
		return Value{}, c.fail(fmt.Errorf("reading redis message: %w", err))
	}

	return v, nil
}

// Bulk returns s encoded as a RESP bulk string, to build commands for
// DoInts once and reuse them.
func Bulk(s string) string {
	return "$" + strconv.Itoa(len(s)) + "\r\n" + s + "\r\n"
}

// Do runs one command.
func (c *Conn) Do(deadline time.Time, args ...string) (Value, error) {
	replies, err := c.Pipeline(deadline, [][]string{args})
	if err != nil {
		return Value{}, err
	}

	return replies[0], nil
}

func (c *Conn) fail(err error) error {
	c.err = err
	_ = c.nc.Close()

	return err
}

// writeCommand writes args as a RESP array of bulk strings.
func writeCommand(bw *bufio.Writer, args []string) error {
	var num [24]byte

	bw.WriteByte('*')
	bw.Write(strconv.AppendInt(num[:0], int64(len(args)), 10))
	bw.WriteString("\r\n")

	for _, a := range args {
		bw.WriteByte('$')
		bw.Write(strconv.AppendInt(num[:0], int64(len(a)), 10))
		bw.WriteString("\r\n")
		bw.WriteString(a)

		if _, err := bw.WriteString("\r\n"); err != nil {
			return err
		}
	}

	return nil
}

// reader parses replies within Limits.
type reader struct {
	br       *bufio.Reader
	lim      Limits
	elements int // values left in this reply
	bytes    int // bulk bytes left in this reply
}

func (r *reader) readReply() (Value, error) {
	r.elements = r.lim.MaxElements
	r.bytes = r.lim.MaxBulk

	return r.read(0)
}

// readInts reads an array of integers, or an error reply as its text.
func (r *reader) readInts() ([]int64, string, error) {
	line, err := r.line()
	if err != nil {
		return nil, "", err
	}

	return r.intsFrom(line)
}

// intsFrom is readInts after its first line, read without the CRLF.
func (r *reader) intsFrom(line []byte) ([]int64, string, error) {
	if len(line) > 0 && line[0] == KindError {
		return nil, string(line[1:]), nil
	}

	if len(line) == 0 || line[0] != KindArray {
		return nil, "", fmt.Errorf("%w: %q where an array of integers was expected", ErrUnexpected, truncate(line))
	}

	n, err := parseInt(line[1:])
	if err != nil {
		return nil, "", err
	}

	if n < 0 || n > int64(r.lim.MaxElements) {
		return nil, "", fmt.Errorf("%w: array length %d where integers were expected", ErrUnexpected, n)
	}

	out := make([]int64, int(n))

	// The elements are read inline rather than with line and parseInt: this
	// runs on every rate-limit call (tierlimit's doc.go: frames).
	for i := range out {
		b, err := r.br.ReadSlice('\n')
		if err != nil || len(b) < 4 || b[0] != KindInteger || b[len(b)-2] != '\r' {
			return nil, "", badInteger(b, err, r.br.Size())
		}

		v, err := strconv.ParseInt(string(b[1:len(b)-2]), 10, 64)
		if err != nil {
			return nil, "", badInteger(b, nil, r.br.Size())
		}

		out[i] = v
	}

	return out, "", nil
}

// badInteger explains why b, read where an integer element was expected (with
// the read error err, if any), is not one.
func badInteger(b []byte, err error, size int) error {
	switch {
	case err == bufio.ErrBufferFull:
		return fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, size)
	case err != nil:
		return err
	case len(b) < 2 || b[len(b)-2] != '\r':
		return fmt.Errorf("%w: line not terminated by CRLF", ErrProtocol)
	case len(b) == 2 || b[0] != KindInteger:
		return fmt.Errorf("%w: %q where an integer was expected", ErrUnexpected, truncate(b[:len(b)-2]))
	}

	return fmt.Errorf("%w: bad integer %q", ErrProtocol, truncate(b[1:len(b)-2]))
}

// read reads one value. It keeps to the common kinds and leaves bulk
// strings, arrays and errors to functions of their own (tierlimit's doc.go:
// frames).
func (r *reader) read(depth int) (Value, error) {
	r.elements--
	if r.elements < 0 || depth > r.lim.MaxDepth {
		return Value{}, r.tooMuch(depth)
	}

	line, err := r.line()
	if err != nil {
		return Value{}, err
	}

	if len(line) == 0 {
		return Value{}, fmt.Errorf("%w: empty line", ErrProtocol)
	}

	switch line[0] {
	case KindInteger:
		n, err := parseInt(line[1:])
		return Value{Kind: KindInteger, Int: n}, err
	case KindSimple, KindError:
		return Value{Kind: line[0], Str: string(line[1:])}, nil
	case KindBulk:
		return r.bulk(line[1:])
	case KindArray:
		return r.array(line[1:], depth)
	}

	return Value{}, fmt.Errorf("%w: unexpected reply type %q", ErrProtocol, line[0])
}

func (r *reader) tooMuch(depth int) error {
	if depth > r.lim.MaxDepth {
		return fmt.Errorf("%w: arrays nested deeper than %d", ErrProtocol, r.lim.MaxDepth)
	}

	return fmt.Errorf("%w: more than %d values in one reply", ErrProtocol, r.lim.MaxElements)
}

// bulk reads a bulk string whose length line was head.
func (r *reader) bulk(head []byte) (Value, error) {
	n, err := parseInt(head)
	if err != nil {
		return Value{}, err
	}

	if n == -1 {
		return Value{Kind: KindBulk, Null: true}, nil
	}

	if n < 0 || n > int64(r.bytes) {
		return Value{}, fmt.Errorf("%w: bulk length %d out of bounds (at most %d)", ErrProtocol, n, r.bytes)
	}

	r.bytes -= int(n)

	buf := make([]byte, int(n)+2)
	if _, err := io.ReadFull(r.br, buf); err != nil {
		return Value{}, err
	}

	if buf[n] != '\r' || buf[n+1] != '\n' {
		return Value{}, fmt.Errorf("%w: bulk string not terminated by CRLF", ErrProtocol)
	}

	return Value{Kind: KindBulk, Str: string(buf[:n])}, nil
}

// array reads an array whose length line was head.
func (r *reader) array(head []byte, depth int) (Value, error) {
	n, err := parseInt(head)
	if err != nil {
		return Value{}, err
	}

	if n == -1 {
		return Value{Kind: KindArray, Null: true}, nil
	}

	if n < 0 || n > int64(r.elements) {
		return Value{}, fmt.Errorf("%w: array length %d out of bounds (at most %d)", ErrProtocol, n, r.elements)
	}

	// Grow as elements arrive rather than trusting the announced length.
	size := int(n)
	if size > 16 {
		size = 16
	}

	arr := make([]Value, 0, size)

	for i := int64(0); i < n; i++ {
		v, err := r.read(depth + 1)
		if err != nil {
			return Value{}, err
		}

		arr = append(arr, v)
	}

	return Value{Kind: KindArray, Array: arr}, nil
}

// line reads one CRLF-terminated line, without the CRLF, of at most MaxLine bytes.
func (r *reader) line() ([]byte, error) {
	b, err := r.br.ReadSlice('\n')

	return r.checkLine(b, err)
}

// checkLine is line after its ReadSlice.
func (r *reader) checkLine(b []byte, err error) ([]byte, error) {
	if err == bufio.ErrBufferFull {
		return nil, fmt.Errorf("%w: line longer than %d bytes", ErrProtocol, r.br.Size())
	}

	if err != nil {
		return nil, err
	}

	if len(b) < 2 || b[len(b)-2] != '\r' {
		return nil, fmt.Errorf("%w: line not terminated by CRLF", ErrProtocol)
	}

	return b[:len(b)-2], nil
}

func parseInt(b []byte) (int64, error) {
	n, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: bad integer %q", ErrProtocol, truncate(b))
	}

	return n, nil
}

func truncate(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "..."
	}

	return string(b)
}
