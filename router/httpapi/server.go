package httpapi

import (
	"net/http"
	"time"
)

// NewServer returns an http.Server for h on addr with the timeouts and
// limits a node's API needs against slow or oversized clients: 5s to read
// the headers, 10s to read a request, 10s to write an answer, 120s for an
// idle keep-alive connection, 64 KiB of headers.
func NewServer(addr string, h http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}
