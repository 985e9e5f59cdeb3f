package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/identity"
	"github.com/sluicehq/sluice/transport/proxy"
)

// The conformance tests check what the proxy promises of a forwarded
// request on each of its two ways upstream: the forwarder (GET and HEAD
// without a body, the default) and httputil.ReverseProxy (every request
// when the Config names a Transport, and otherwise bodies and upgrades).
// Each runs against real upstream servers on loopback.

// way is one way upstream: a Config that selects it.
type way struct {
	name string
	cfg  func(t *testing.T, headerTimeout time.Duration) proxy.Config
}

func ways() []way {
	return []way{
		{"forwarder", func(t *testing.T, hw time.Duration) proxy.Config {
			return proxy.Config{Decider: service(t, "domain: api\n", nil), ResponseHeaderTimeout: hw, DialTimeout: time.Second}
		}},
		{"reverseproxy", func(t *testing.T, hw time.Duration) proxy.Config {
			tr := &http.Transport{ResponseHeaderTimeout: hw, DisableCompression: true}
			t.Cleanup(tr.CloseIdleConnections)
			return proxy.Config{Decider: service(t, "domain: api\n", nil), Transport: tr}
		}},
	}
}

// TestConformanceHeaders: hop-by-hop fields (RFC 9110 section 7.6.1: those
// Connection names and the fixed set) go no further in either direction,
// end-to-end fields do, X-Forwarded-For gets the peer appended to the
// client's list, X-Forwarded-Host and -Proto are the proxy's own, and the
// path and query join the upstream's.
func TestConformanceHeaders(t *testing.T) {
	t.Parallel()
	type seen struct {
		uri, host string
		h         http.Header
	}
	got := make(chan seen, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{r.RequestURI, r.Host, r.Header.Clone()}
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=9")
		w.Header().Set("X-Resp-End", "1")
		w.Header().Set("Content-Length", "2")
		io.WriteString(w, "ok")
	}))
	t.Cleanup(upstream.Close)
	for _, wy := range ways() {
		for _, method := range []string{http.MethodGet, http.MethodHead, http.MethodPost} {
			t.Run(wy.name+"/"+method, func(t *testing.T) {
				p := newProxy(t, upstream.URL+"/base?k=v", wy.cfg(t, 0))
				front := httptest.NewServer(p)
				t.Cleanup(front.Close)
				var body io.Reader
				if method == http.MethodPost {
					body = strings.NewReader("payload")
				}
				req, err := http.NewRequest(method, front.URL+"/a/b?x=1", body)
				if err != nil {
					t.Fatal(err)
				}
				for k, v := range map[string]string{
					"Connection": "X-Hop, keep-alive", "X-Hop": "1", "Keep-Alive": "timeout=5",
					"Proxy-Authorization": "Basic c2VjcmV0", "Te": "trailers", "X-End": "2",
					"X-Forwarded-For": "203.0.113.7", "Forwarded": "for=198.51.100.1", "X-Forwarded-Host": "evil.example",
				} {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil {
					t.Fatal(err)
				}
				s := <-got
				for _, k := range []string{"Connection", "X-Hop", "Keep-Alive", "Proxy-Authorization", "Forwarded"} {
					if v, ok := s.h[k]; ok {
						t.Errorf("upstream got %s: %q", k, v)
					}
				}
				frontHost := strings.TrimPrefix(front.URL, "http://")
				for k, want := range map[string]string{
					"X-End": "2", "Te": "trailers", "X-Forwarded-For": "203.0.113.7, 127.0.0.1",
					"X-Forwarded-Host": frontHost, "X-Forwarded-Proto": "http",
				} {
					if v := s.h.Values(k); len(v) != 1 || v[0] != want {
						t.Errorf("upstream got %s: %q, want %q", k, v, want)
					}
				}
				if s.uri != "/base/a/b?k=v&x=1" || s.host != strings.TrimPrefix(upstream.URL, "http://") {
					t.Errorf("upstream got %s for host %s", s.uri, s.host)
				}
				if method == http.MethodPost && s.h.Get("Content-Length") != "7" {
					t.Errorf("upstream got Content-Length %q, want 7", s.h.Get("Content-Length"))
				}
				for _, k := range []string{"X-Resp-Hop", "Keep-Alive"} {
					if v, ok := resp.Header[k]; ok {
						t.Errorf("client got %s: %q", k, v)
					}
				}
				wantBody := "ok"
				if method == http.MethodHead {
					wantBody = ""
				}
				if resp.StatusCode != 200 || resp.Header.Get("X-Resp-End") != "1" || string(b) != wantBody || resp.ContentLength != 2 {
					t.Errorf("client got %d %q, X-Resp-End %q, length %d", resp.StatusCode, b, resp.Header.Get("X-Resp-End"), resp.ContentLength)
				}
			})
		}
	}
}

// TestConformancePreserveHost: with PreserveHost the upstream gets the
// Host the client asked for, without it the upstream's own.
func TestConformancePreserveHost(t *testing.T) {
	t.Parallel()
	hosts := make(chan string, 1)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts <- r.Host
	}))
	t.Cleanup(upstream.Close)
	for _, wy := range ways() {
		for _, preserve := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%v", wy.name, preserve), func(t *testing.T) {
				cfg := wy.cfg(t, 0)
				cfg.PreserveHost = preserve
				front := httptest.NewServer(newProxy(t, upstream.URL, cfg))
				t.Cleanup(front.Close)
				req, err := http.NewRequest(http.MethodGet, front.URL+"/", nil)
				if err != nil {
					t.Fatal(err)
				}
				req.Host = "app.example"
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				want := strings.TrimPrefix(upstream.URL, "http://")
				if preserve {
					want = "app.example"
				}
				if got := <-hosts; got != want {
					t.Fatalf("upstream got Host %q, want %q", got, want)
				}
			})
		}
	}
}

// TestConformanceStreaming: a response of unknown length reaches the
// client write by write while the upstream is still writing, and its
// trailers follow it.
func TestConformanceStreaming(t *testing.T) {
	t.Parallel()
	for _, wy := range ways() {
		t.Run(wy.name, func(t *testing.T) {
			t.Parallel()
			next := make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Trailer", "X-Count")
				for i := range 3 {
					fmt.Fprintf(w, "part %d\n", i)
					w.(http.Flusher).Flush()
					select {
					case <-next:
					case <-r.Context().Done():
						return
					}
				}
				w.Header().Set("X-Count", "3")
			}))
			t.Cleanup(upstream.Close)
			front := httptest.NewServer(newProxy(t, upstream.URL, wy.cfg(t, 0)))
			t.Cleanup(front.Close)
			resp, err := http.Get(front.URL + "/stream")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			for i := range 3 {
				line, err := br.ReadString('\n')
				if err != nil || line != fmt.Sprintf("part %d\n", i) {
					t.Fatalf("part %d: %q %v", i, line, err)
				}
				next <- struct{}{} // the upstream writes the next part only now
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 {
				t.Fatalf("after the parts: %q %v", rest, err)
			}
			if v := resp.Trailer.Get("X-Count"); v != "3" {
				t.Fatalf("trailer X-Count %q, want 3", v)
			}
		})
	}
}

// TestConformanceUpgrade: a WebSocket upgrade passes through, the 101 and
// its Upgrade and Connection fields reach the client, and then bytes flow
// both ways over the hijacked connections.
func TestConformanceUpgrade(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" || !strings.EqualFold(r.Header.Get("Connection"), "upgrade") {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, err := brw.ReadString('\n') // echo one line
		if err != nil {
			return
		}
		brw.WriteString("echo " + line)
		brw.Flush()
	}))
	t.Cleanup(upstream.Close)
	for _, wy := range ways() {
		t.Run(wy.name, func(t *testing.T) {
			t.Parallel()
			front := httptest.NewServer(newProxy(t, upstream.URL, wy.cfg(t, 0)))
			t.Cleanup(front.Close)
			conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Upgrade") != "websocket" {
				t.Fatalf("status %d, Upgrade %q", resp.StatusCode, resp.Header.Get("Upgrade"))
			}
			io.WriteString(conn, "hello\n")
			line, err := br.ReadString('\n')
			if err != nil || line != "echo hello\n" {
				t.Fatalf("over the upgraded connection: %q %v", line, err)
			}
		})
	}
}

// TestConformanceHTTP2: clients speaking HTTP/2 over TLS are served, with
// and without a body.
func TestConformanceHTTP2(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %q", r.Method, r.URL.Path, b)
	}))
	t.Cleanup(upstream.Close)
	for _, wy := range ways() {
		t.Run(wy.name, func(t *testing.T) {
			t.Parallel()
			front := httptest.NewUnstartedServer(newProxy(t, upstream.URL, wy.cfg(t, 0)))
			front.EnableHTTP2 = true
			front.StartTLS()
			t.Cleanup(front.Close)
			client := front.Client()
			for _, tt := range []struct{ method, body, want string }{
				{http.MethodGet, "", `GET /h2 ""`},
				{http.MethodPost, "data", `POST /h2 "data"`},
			} {
				req, err := http.NewRequest(tt.method, front.URL+"/h2", strings.NewReader(tt.body))
				if err != nil {
					t.Fatal(err)
				}
				if tt.body == "" {
					req.Body = nil
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.ProtoMajor != 2 || string(b) != tt.want {
					t.Fatalf("%s: HTTP/%d %q %v, want HTTP/2 %q", tt.method, resp.ProtoMajor, b, err, tt.want)
				}
			}
		})
	}
}

// TestConformanceFailures: 502 when the upstream cannot be reached or
// answers nothing a proxy can pass on, 504 when its response headers are
// late, and a response cut short reaches the client as one (not as a
// whole, shorter body).
func TestConformanceFailures(t *testing.T) {
	t.Parallel()
	closedURL, slowURL := failingUpstreams(t)
	short := rawUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
	garbage := rawUpstream(t, "SMTP ready\r\n\r\n")
	for _, wy := range ways() {
		for _, method := range []string{http.MethodGet, http.MethodPost} {
			for _, tt := range []struct {
				name, upstream string
				want           int // 0: the body is cut short
			}{
				{"refused", closedURL, 502},
				{"late headers", slowURL, 504},
				{"not HTTP", garbage, 502},
				{"short body", short, 0},
			} {
				t.Run(wy.name+"/"+method+"/"+tt.name, func(t *testing.T) {
					t.Parallel()
					front := httptest.NewServer(newProxy(t, tt.upstream, wy.cfg(t, 100*time.Millisecond)))
					t.Cleanup(front.Close)
					req, err := http.NewRequest(method, front.URL+"/", nil)
					if err != nil {
						t.Fatal(err)
					}
					if method == http.MethodPost {
						req.Body = io.NopCloser(strings.NewReader("x"))
						req.ContentLength = 1
					}
					resp, err := http.DefaultClient.Do(req)
					if err != nil && tt.want == 0 {
						return // cut short before the headers left the proxy's buffer
					}
					if err != nil {
						t.Fatal(err)
					}
					b, err := io.ReadAll(resp.Body)
					resp.Body.Close()
					if tt.want == 0 {
						if err == nil {
							t.Fatalf("status %d, body %q read whole; want it cut short", resp.StatusCode, b)
						}
						return
					}
					if resp.StatusCode != tt.want {
						t.Fatalf("status %d, want %d", resp.StatusCode, tt.want)
					}
				})
			}
		}
	}
}

// TestConformanceReuse: sequential requests share one upstream connection,
// and a kept-alive connection the upstream closed while idle costs the
// client nothing: the request goes again on a new one.
func TestConformanceReuse(t *testing.T) {
	t.Parallel()
	var conns atomic.Int64
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	upstream.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	upstream.Start()
	t.Cleanup(upstream.Close)
	// oneShot answers one request per connection, then closes it without
	// saying so: as an upstream whose idle timeout just passed.
	oneShot := rawUpstream(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	for _, wy := range ways() {
		t.Run(wy.name, func(t *testing.T) {
			front := httptest.NewServer(newProxy(t, upstream.URL, wy.cfg(t, 0)))
			t.Cleanup(front.Close)
			before := conns.Load()
			for i := range 20 {
				if resp, body := get(t, front.URL, fmt.Sprint(i)); resp == nil || resp.StatusCode != 200 || body != "ok" {
					t.Fatalf("request %d: %v %q", i, resp, body)
				}
			}
			if n := conns.Load() - before; n != 1 {
				t.Fatalf("20 requests took %d upstream connections, want 1", n)
			}
			front2 := httptest.NewServer(newProxy(t, oneShot, wy.cfg(t, 0)))
			t.Cleanup(front2.Close)
			for i := range 5 {
				if resp, body := get(t, front2.URL, fmt.Sprint(i)); resp == nil || resp.StatusCode != 200 || body != "ok" {
					t.Fatalf("request %d to an upstream closing idle connections: %v %q", i, resp, body)
				}
			}
		})
	}
}

// TestConformanceClientGone: when the client leaves while the upstream is
// still working on its request, the upstream's request is cancelled too.
func TestConformanceClientGone(t *testing.T) {
	t.Parallel()
	for _, wy := range ways() {
		t.Run(wy.name, func(t *testing.T) {
			t.Parallel()
			arrived, cancelled := make(chan struct{}), make(chan struct{})
			upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				close(arrived)
				<-r.Context().Done()
				close(cancelled)
			}))
			t.Cleanup(upstream.Close)
			front := httptest.NewServer(newProxy(t, upstream.URL, wy.cfg(t, 0)))
			t.Cleanup(front.Close)
			ctx, cancel := context.WithCancel(context.Background())
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, front.URL+"/", nil)
			if err != nil {
				t.Fatal(err)
			}
			errc := make(chan error, 1)
			go func() { // ends when the client's request is cancelled
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
				}
				errc <- err
			}()
			<-arrived
			cancel()
			if err := <-errc; err == nil {
				t.Fatal("the cancelled request succeeded")
			}
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream's request was not cancelled")
			}
		})
	}
}

// rawUpstream reads one request on each connection on loopback, writes
// answer and closes the connection. It returns the upstream's URL.
func rawUpstream(t testing.TB, answer string) string {
	t.Helper()
	return rawUpstreamFunc(t, func() []byte { return []byte(answer) })
}

// rawUpstreamFunc is rawUpstream with the answer of answer() at the time
// of each request.
func rawUpstreamFunc(t testing.TB, answer func() []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	go func() { // ends when the listener closes
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			req, err := http.ReadRequest(bufio.NewReader(conn))
			if err == nil {
				_, err = io.Copy(io.Discard, req.Body)
			}
			if err == nil {
				conn.Write(answer())
			}
			conn.Close()
		}
	}()
	return "http://" + ln.Addr().String()
}

// FuzzForwarderResponse feeds the forwarder an upstream that answers any
// bytes: the client gets the upstream's own status when those bytes are
// an HTTP response net/http reads, 502 when they are not, and the proxy
// never fails otherwise (http.ErrAbortHandler, the cut-short body, is the
// only panic allowed).
func FuzzForwarderResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 204 No Content\r\nConnection: X-A, close\r\nX-A: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n2\r\nok\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\nuntil close",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 999 Odd\r\nContent-Length: -1\r\n\r\n",
		"garbage\r\n\r\n",
		"",
	} {
		f.Add([]byte(s))
	}
	var mu sync.Mutex
	var answer []byte
	upstream := rawUpstreamFunc(f, func() []byte {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Clone(answer) // the fuzzer may reuse answer's bytes later
	})
	id, err := identity.New(identity.Config{Domain: "fuzz"}, nil) // no limits: nothing to decide
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		mu.Lock()
		answer = b
		mu.Unlock()
		want := http.StatusBadGateway
		if resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(b)), nil); err == nil {
			resp.Body.Close()
			want = resp.StatusCode
		}
		for _, wy := range ways() {
			cfg := wy.cfg(t, 5*time.Second)
			cfg.Identity = id
			p := newProxy(t, upstream, cfg)
			rec := httptest.NewRecorder()
			func() {
				defer func() {
					if v := recover(); v != nil && v != http.ErrAbortHandler {
						t.Fatalf("%s: panic %v", wy.name, v)
					}
				}()
				p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
			}()
			if want >= 200 && want <= 999 && rec.Code != want && rec.Code != http.StatusBadGateway {
				t.Fatalf("%s: status %d, the upstream said %d", wy.name, rec.Code, want)
			}
			if (want < 100 || want > 999) && rec.Code != http.StatusBadGateway {
				t.Fatalf("%s: status %d for an answer net/http does not read, want 502", wy.name, rec.Code)
			}
		}
	})
}
