package main

import (
	"bytes"
	"net"
	"strconv"

	"github.com/panjf2000/gnet/v2"
)

// gnetFloor answers on github.com/panjf2000/gnet/v2's event loops (one
// per P, epoll driven by the loop itself rather than by the Go runtime's
// netpoller, no goroutine per connection): each loop frames the requests
// its connections hold, as serveRaw does, and writes the answers inline.
// A measuring instrument, not a server.
type gnetFloor struct {
	gnet.BuiltinEventEngine
}

func (*gnetFloor) OnTraffic(c gnet.Conn) gnet.Action {
	var out []byte
	for {
		buf, _ := c.Peek(-1)
		head := bytes.Index(buf, []byte("\r\n\r\n"))
		if head < 0 {
			break
		}
		n := 0
		for _, line := range bytes.Split(buf[:head], []byte("\r\n")) {
			const cl = "content-length:"
			if len(line) > len(cl) && bytes.EqualFold(line[:len(cl)], []byte(cl)) {
				var err error
				if n, err = strconv.Atoi(string(bytes.TrimSpace(line[len(cl):]))); err != nil || n < 0 {
					return gnet.Close
				}
			}
		}
		end := head + 4 + n
		if len(buf) < end {
			break
		}
		a := floorAnswer(buf[head+4 : end])
		out = append(out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nContent-Length: "...)
		out = strconv.AppendInt(out, int64(len(a)), 10)
		out = append(out, "\r\n\r\n"...)
		out = append(out, a...)
		_, _ = c.Discard(end)
	}
	if len(out) > 0 {
		_, _ = c.Write(out)
	}
	return gnet.None
}

// serveGnet serves the fixed answer with gnet on ln's address (gnet
// listens itself: ln is closed first).
func serveGnet(ln net.Listener) error {
	addr := ln.Addr().String()
	ln.Close()
	return gnet.Run(&gnetFloor{}, "tcp://"+addr, gnet.WithMulticore(true), gnet.WithReusePort(false))
}
