// Package redisresp is a minimal RESP2 client for Redis, written with the
// standard library only so that Yaegi can run it inside Traefik.
//
// Server error replies ("-ERR ...") are values (a Value of KindError), not Go
// errors: the connection stays usable and callers test v.IsError(). Go errors
// are I/O and protocol failures; after one, the connection is closed. Every
// read is bounded (line length, bulk length, number of elements), so a broken
// or hostile server cannot make the client allocate without limit.
//
// No goroutines; all types are safe for concurrent use unless said otherwise.
package redisresp

import (
	"errors"
	"strconv"
)

// Kinds of reply, named by their RESP2 type byte.
const (
	KindSimple  byte = '+'
	KindError   byte = '-'
	KindInteger byte = ':'
	KindBulk    byte = '$'
	KindArray   byte = '*'
)

// Value is one reply. Str holds simple strings, bulk strings and error texts;
// Int holds integers; Array holds the elements of an array. Null is set for a
// null bulk string or null array.
type Value struct {
	Kind  byte
	Str   string
	Int   int64
	Array []Value
	Null  bool
}

// IsError reports whether v is a server error reply.
func (v Value) IsError() bool {
	return v.Kind == KindError
}

// String renders v for messages.
func (v Value) String() string {
	switch v.Kind {
	case KindInteger:
		return strconv.FormatInt(v.Int, 10)
	case KindArray:
		return "array(" + strconv.Itoa(len(v.Array)) + ")"
	default:
		if v.Null {
			return "(nil)"
		}

		return v.Str
	}
}

// Errors. Each is wrapped with what was being done: test them with errors.Is.
var (
	// ErrProtocol: the server sent something that is not RESP2, or exceeded a bound.
	ErrProtocol = errors.New("redis protocol error")
	// ErrUnexpected: a well-formed reply of another shape than the call expects
	// (DoInts); the connection is closed, as the rest of the reply is unread.
	ErrUnexpected = errors.New("unexpected redis reply")
	// ErrPoolTimeout: no connection became free before the call's deadline.
	ErrPoolTimeout = errors.New("redis pool exhausted")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("redis pool closed")
	// ErrNotPrimary: a server that should be the primary is a replica.
	ErrNotPrimary = errors.New("redis server is not the primary")
	// ErrNoPrimary: no sentinel named a primary.
	ErrNoPrimary = errors.New("no sentinel named the primary")
	// ErrServer: the server answered a call with an error reply (ScriptInts).
	ErrServer = errors.New("redis error reply")
)
