package redisresp

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func message(channel, payload string) string {
	return "*3\r\n" + bulk("message") + bulk(channel) + bulk(payload)
}

// pubsubHandler confirms subscriptions and answers PING as a subscribed
// Redis does, appending push to the last SUBSCRIBE's confirmation and pong
// to PING's answer.
func pubsubHandler(push, pong string) func(int, []string) string {
	subscribed := 0

	return func(_ int, args []string) string {
		switch strings.ToUpper(args[0]) {
		case "AUTH", "SELECT":
			return "+OK\r\n"
		case "SUBSCRIBE":
			subscribed++
			reply := "*3\r\n" + bulk("subscribe") + bulk(args[1]) + ":" + string(rune('0'+subscribed)) + "\r\n"

			if args[1] == "b" {
				reply += push
			}

			return reply
		case "PING":
			return "*2\r\n" + bulk("pong") + bulk("") + pong
		}

		return "-ERR unknown command\r\n"
	}
}

// A subscribed connection is set up as a pool's (AUTH, SELECT), subscribes
// to each channel, reads its messages, drops replies that are not messages,
// outlives a quiet wait and answers a PING in the stream.
func TestSubscribeFollowsMessages(t *testing.T) {
	push := "*2\r\n" + bulk("message") + bulk("b") + // too short
		":1\r\n" + // not an array
		"*3\r\n" + bulk("message") + bulk("a") + "$-1\r\n" + // a null payload
		"*3\r\n" + bulk("pmessage") + bulk("a") + bulk("x") + // another kind
		message("a", "p1")
	s := startServer(t, pubsubHandler(push, message("b", "p\x002")))

	opts := longOptions(s.addr())
	opts.Username, opts.Password, opts.DB = "u", "pw", 2

	c, err := Subscribe(opts, []string{"a", "b"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var got []string
	for _, cmd := range s.log() {
		got = append(got, strings.Join(cmd.args, " "))
	}

	if strings.Join(got, "|") != "AUTH u pw|SELECT 2|SUBSCRIBE a|SUBSCRIBE b" {
		t.Fatalf("commands: %q", got)
	}

	for i, want := range []Message{{}, {}, {}, {}, {Channel: "a", Payload: "p1"}} {
		if m, err := ReceiveMessage(c, time.Now().Add(failAfter)); err != nil || m != want {
			t.Fatalf("reply %d: %+v %v, want %+v", i, m, err, want)
		}
	}

	// Nothing more until a PING: the wait ends quietly, the connection stays.
	if _, err := ReceiveMessage(c, time.Now().Add(20*time.Millisecond)); !errors.Is(err, ErrQuiet) || c.Err() != nil {
		t.Fatalf("quiet wait: %v, connection %v", err, c.Err())
	}

	if err := Ping(c, time.Now().Add(failAfter)); err != nil {
		t.Fatal(err)
	}

	for i, want := range []Message{{}, {Channel: "b", Payload: "p\x002"}} {
		if m, err := ReceiveMessage(c, time.Now().Add(failAfter)); err != nil || m != want {
			t.Fatalf("after the ping, reply %d: %+v %v, want %+v", i, m, err, want)
		}
	}
}

// A channel the server refuses (an ACL without it) fails the subscription
// with the server's words.
func TestSubscribeRefusedChannel(t *testing.T) {
	s := startServer(t, func(_ int, args []string) string {
		if args[0] == "SUBSCRIBE" && args[1] == "b" {
			return "-NOPERM this user has no permissions to access one of the channels used as arguments\r\n"
		}

		return "*3\r\n" + bulk("subscribe") + bulk(args[1]) + ":1\r\n"
	})

	if _, err := Subscribe(longOptions(s.addr()), []string{"a", "b"}); err == nil || !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "subscribing to b") {
		t.Fatalf("err %v", err)
	}

	if _, err := Subscribe(longOptions(closedAddr(t)), []string{"a"}); err == nil {
		t.Fatal("subscribed to nothing")
	}
}

// A message over the limits, or one that stops halfway, is an error that
// closes the connection, never a quiet wait.
func TestReceiveBoundsMessages(t *testing.T) {
	for name, push := range map[string]string{
		"too long": message("b", strings.Repeat("x", 1000)),
		"cut":      "*3\r\n" + bulk("message") + "$5\r\nab",
	} {
		s := startServer(t, pubsubHandler(push, ""))

		opts := longOptions(s.addr())
		opts.Limits = Limits{MaxBulk: 100}
		opts.Timeout = 50 * time.Millisecond // bounds the cut reply's read

		c, err := Subscribe(opts, []string{"b"})
		if err != nil {
			t.Fatal(err)
		}

		if _, err := ReceiveMessage(c, time.Now().Add(failAfter)); err == nil || errors.Is(err, ErrQuiet) || c.Err() == nil {
			t.Fatalf("%s: %v, connection %v", name, err, c.Err())
		}

		if _, err := ReceiveMessage(c, time.Now().Add(failAfter)); err == nil {
			t.Fatalf("%s: a closed connection received", name)
		}

		c.Close()
	}
}

// Interrupt ends a wait in another goroutine.
func TestInterruptEndsAWait(t *testing.T) {
	s := startServer(t, pubsubHandler("", ""))

	c, err := Subscribe(longOptions(s.addr()), []string{"b"})
	if err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)

	go func() {
		_, err := ReceiveMessage(c, time.Now().Add(failAfter))
		done <- err
	}()

	Interrupt(c)

	if err := awaitErr(t, done, "the interrupted wait"); err == nil || errors.Is(err, ErrQuiet) {
		t.Fatalf("err %v", err)
	}
}
