package pipenet

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"testing/synctest"
	"time"
)

// A dialled connection reaches Accept and carries bytes both ways; a
// closed listener refuses both, and a dial nobody accepts ends with its
// context.
func TestListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := NewListener()
		go func() {
			c, err := l.Accept()
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			_, _ = io.Copy(c, c) // echo
		}()
		c, err := l.Dial(context.Background(), "ignored")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write([]byte("hi")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "hi" {
			t.Fatalf("echo = %q, %v; want \"hi\"", buf, err)
		}
		c.Close()

		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := l.DialContext(ctx, "tcp", "x"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("dial nobody accepts: %v, want context.DeadlineExceeded", err)
		}
		l.Close()
		l.Close()
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
		}
		if _, err := l.Dial(context.Background(), "x"); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Dial after Close: %v, want net.ErrClosed", err)
		}
		if a := l.Addr(); a.Network() != "pipe" || a.String() != "pipe" {
			t.Errorf("Addr = %v/%v", a.Network(), a.String())
		}
	})
}
