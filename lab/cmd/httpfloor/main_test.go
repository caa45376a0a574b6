package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// The bare loop is a measuring stick only if it answers HTTP as net/http
// does for this load: each request on a kept-alive connection read whole
// and answered once, a group's requests held together and then all woken.
func TestLoopAnswersEachRequestOnAKeptAliveConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	response := []byte("HTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nabc")
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go answerLoop(c, response, 5*time.Millisecond)
		}
	}()
	tr := &http.Transport{MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	for i := range 3 {
		start := time.Now()
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
			"http://"+ln.Addr().String()+"/v1/charges", bytes.NewReader(chargeBody))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", fmt.Sprint("k", i))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusCreated || string(body) != "abc" {
			t.Fatalf("request %d: %d %q %v, want 201 \"abc\"", i, resp.StatusCode, body, err)
		}
		if held := time.Since(start); held < 5*time.Millisecond {
			t.Errorf("request %d answered after %v, want after its group's 5ms", i, held)
		}
	}
	if n := accepted.Load(); n != 1 {
		t.Errorf("%d connections for 3 requests, want 1 kept alive", n)
	}
}

func TestLoopClosesOnABodyItCannotRead(t *testing.T) {
	t.Parallel()
	for _, head := range []string{
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", // no Content-Length
		"POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 4096\r\n\r\n", // over its buffer
	} {
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { answerLoop(server, []byte("HTTP/1.1 201 Created\r\n\r\n"), 0); close(done) }()
		go func() { _, _ = client.Write([]byte(head)) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%q: the loop kept the connection", head)
		}
		_ = client.Close()
	}
}
