package main

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
)

// The raw floor answers keep-alive requests in turn, each with the
// answer the other floors give for its body.
func TestServeRaw(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serveRaw(c)
		}
	}()
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for _, body := range []string{
		`{"rule":"bench","key":"k","cost":1}`,
		`{"checks":[{"rule":"bench","key":"a"},{"rule":"bench","key":"b"}]}`,
		`{"rule":"bench","key":"k2","cost":1}`,
	} {
		resp, err := hc.Post("http://"+ln.Addr().String()+"/v1/check", "application/json", bytes.NewReader([]byte(body)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if want := floorAnswer([]byte(body)); resp.StatusCode != http.StatusOK || !bytes.Equal(got, want) {
			t.Errorf("POST %s: %d %q, want 200 %q", body, resp.StatusCode, got, want)
		}
	}
}
