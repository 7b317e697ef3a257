package redisresp

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Subscriptions. A subscribed connection receives messages it did not ask
// for, so it belongs to one goroutine that waits on it (ReceiveMessage) and writes
// only PINGs to it (Ping), which Redis answers in the message stream. These
// are plain functions on a Conn, so that the caller owns the loop, its
// reconnection and its back-off.

// Message is one reply of a subscribed connection. Channel is "" for a reply
// that is not a message: a subscription's confirmation, a PING's answer, or
// a reply of an unexpected shape, which is dropped.
type Message struct {
	Channel string
	Payload string
}

// ErrQuiet is ReceiveMessage's error when nothing arrived before the deadline; the
// connection stays usable, unlike after any other error.
var ErrQuiet = errors.New("no message before the deadline")

// Subscribe dials opts.Address as a Pool dials its connections (TLS, AUTH,
// SELECT, ROLE when RequirePrimary; opts' defaults) and subscribes the
// connection to channels, all within DialTimeout. A channel the server
// refuses (an ACL without it) fails the whole call.
func Subscribe(opts Options, channels []string) (*Conn, error) {
	p := NewPool(opts)

	c, err := p.dial()
	if err != nil {
		return nil, err
	}

	cmds := make([][]string, 0, len(channels))
	for _, ch := range channels {
		cmds = append(cmds, []string{"SUBSCRIBE", ch})
	}

	replies, err := c.Pipeline(time.Now().Add(p.opts.DialTimeout), cmds)
	if err != nil {
		return nil, fmt.Errorf("subscribing on redis at %s: %w", p.opts.Address, err)
	}

	for i, v := range replies {
		if v.IsError() || len(v.Array) != 3 || v.Array[0].Str != "subscribe" {
			_ = c.Close()
			return nil, fmt.Errorf("subscribing to %s on redis at %s: %s", channels[i], p.opts.Address, v.String())
		}
	}

	return c, nil
}

// ReceiveMessage waits until deadline for the next reply of the subscribed c, and
// then reads it within the connection's call budget (Options.Timeout). Only
// the wait may time out harmlessly (ErrQuiet): no byte of a reply is read
// until one has arrived.
func ReceiveMessage(c *Conn, deadline time.Time) (Message, error) {
	if c.err != nil {
		return Message{}, c.err
	}

	if err := c.nc.SetReadDeadline(deadline); err != nil {
		return Message{}, c.fail(fmt.Errorf("setting redis deadline: %w", err))
	}

	if _, err := c.rd.br.Peek(1); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return Message{}, ErrQuiet
		}

		return Message{}, c.fail(fmt.Errorf("waiting for a redis message: %w", err))
	}

	budget := c.timeout
	if budget <= 0 {
		budget = rescueGrace
	}

	v, err := c.Receive(time.Now().Add(budget))
	if err != nil {
		return Message{}, err
	}

	return messageOf(v), nil
}

// messageOf reads ["message", channel, payload], every part a bulk string.
func messageOf(v Value) Message {
	if v.Kind != KindArray || len(v.Array) != 3 {
		return Message{}
	}

	for _, part := range v.Array {
		if part.Kind != KindBulk || part.Null {
			return Message{}
		}
	}

	if v.Array[0].Str != "message" || v.Array[1].Str == "" {
		return Message{}
	}

	return Message{Channel: v.Array[1].Str, Payload: v.Array[2].Str}
}

// Ping asks the subscribed c for a sign of life: its answer comes back
// through ReceiveMessage, as a reply that is not a message.
func Ping(c *Conn, deadline time.Time) error {
	if c.err != nil {
		return c.err
	}

	if err := c.nc.SetWriteDeadline(deadline); err != nil {
		return c.fail(fmt.Errorf("setting redis deadline: %w", err))
	}

	if err := writeCommand(c.bw, []string{"PING"}); err != nil {
		return c.fail(fmt.Errorf("writing redis ping: %w", err))
	}

	if err := c.bw.Flush(); err != nil {
		return c.fail(fmt.Errorf("writing redis ping: %w", err))
	}

	return nil
}

// Interrupt ends a ReceiveMessage that another goroutine is waiting in, by closing
// c's network connection; that goroutine owns c and sees the error.
func Interrupt(c *Conn) {
	_ = c.nc.Close()
}

// ClusterNodes lists the nodes of c to subscribe on, best first: a PUBLISH
// on any node of a cluster reaches the subscribers of every node. Known
// nodes come first, then the seeds, nodes that just failed last.
func ClusterNodes(c *Cluster) []string {
	c.mu.Lock()
	defer c.mu.Unlock()

	return c.candidates()
}
