package proxy_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/transport/proxy"
)

// rawServer serves each connection with handle, on loopback, until the
// test ends.
func rawServer(t *testing.T, handle func(c net.Conn, br *bufio.Reader)) (url string, conns *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	conns = new(atomic.Int64)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // owned by the cleanup: ends when the listener closes
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				handle(c, bufio.NewReader(c))
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return "http://" + l.Addr().String(), conns
}

func serveStatus(t *testing.T, p *proxy.Proxy, method string, body io.Reader) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	p.ServeHTTP(rec, httptest.NewRequest(method, "/", body))
	return rec.Code, rec.Body.String()
}

func TestUpstreamConnections(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		handle func(c net.Conn, br *bufio.Reader)
		// want: the status and body of each of three requests, and the
		// connections the upstream saw.
		conns int64
		body  string
	}{
		{"kept alive: one connection", func(c net.Conn, br *bufio.Reader) {
			for {
				r, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, r.Body)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}
		}, 1, "ok"},
		{"closed after each response without saying so: retried on a new one", func(c net.Conn, br *bufio.Reader) {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}, 3, "ok"},
		{"Connection: close is honoured", func(c net.Conn, br *bufio.Reader) {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")
		}, 3, "ok"},
		{"1xx responses are skipped", func(c net.Conn, br *bufio.Reader) {
			for {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal")
			}
		}, 1, "final"},
		{"chunked responses keep the connection", func(c net.Conn, br *bufio.Reader) {
			for {
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
			}
		}, 1, "ok"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url, conns := rawServer(t, tt.handle)
			p := newProxy(t, url, proxy.Config{Decider: service(t, "domain: api\n", nil)})
			for i := range 3 {
				if code, body := serveStatus(t, p, http.MethodGet, nil); code != 200 || body != tt.body {
					t.Fatalf("request %d: %d %q, want 200 %q", i, code, body, tt.body)
				}
			}
			if n := conns.Load(); n != tt.conns {
				t.Fatalf("upstream saw %d connections, want %d", n, tt.conns)
			}
		})
	}
}

// TestUpstreamTruncated: a response cut short gives the client a short
// body, and the connection is not reused.
func TestUpstreamTruncated(t *testing.T) {
	t.Parallel()
	url, conns := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
	})
	p := newProxy(t, url, proxy.Config{Decider: service(t, "domain: api\n", nil)})
	for range 2 {
		if _, body := serveStatus(t, p, http.MethodGet, nil); body != "short" {
			t.Fatalf("body %q", body)
		}
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("upstream saw %d connections, want 2", n)
	}
}

// TestUpgrade: a protocol upgrade (as WebSocket does) passes through both
// ways.
func TestUpgrade(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want an upgrade", 400)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		brw.WriteString("echo " + line)
		brw.Flush()
	}))
	t.Cleanup(upstream.Close)
	p := newProxy(t, upstream.URL, proxy.Config{Decider: service(t, "domain: api\n", nil)})
	front := httptest.NewServer(p)
	t.Cleanup(front.Close)
	c, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	io.WriteString(c, "ping\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo ping\n" {
		t.Fatalf("after the upgrade: %q %v", line, err)
	}
}
