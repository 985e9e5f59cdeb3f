package testenv

import (
	"bufio"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// FakeRedis is a small server that speaks RESP (on a loopback port in
// tests, in a container as internal/fakeredis), for a Redis that lies: a hostile peer region. It answers the commands a
// client sends on connecting (HELLO, CLIENT, SCRIPT LOAD, PING) as Redis
// would, and every other command with what Answer returns for it (its
// name upper-cased, then its arguments): raw RESP bytes, written as they
// are. Close stops it; the test's cleanup does too.
type FakeRedis struct {
	Addr string
	ln   net.Listener

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// StartFakeRedis starts a FakeRedis on a loopback port that answers with
// answer; the test's cleanup closes it.
func StartFakeRedis(t testing.TB, answer func(cmd []string) []byte) *FakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := ServeFakeRedis(ln, answer)
	t.Cleanup(f.Close)
	return f
}

// ServeFakeRedis serves a FakeRedis that answers with answer on ln, which
// it closes on Close. internal/fakeredis runs it as a command, for the
// containers of deploy/image's tests.
func ServeFakeRedis(ln net.Listener, answer func(cmd []string) []byte) *FakeRedis {
	f := &FakeRedis{Addr: ln.Addr().String(), ln: ln, conns: make(map[net.Conn]bool)}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns[c] = true
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.serve(c, answer)
			}()
		}
	}()
	return f
}

// Close stops the server and closes its connections.
func (f *FakeRedis) Close() {
	_ = f.ln.Close()
	f.mu.Lock()
	for c := range f.conns {
		_ = c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *FakeRedis) serve(c net.Conn, answer func([]string) []byte) {
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		_ = c.Close()
	}()
	r := bufio.NewReader(c)
	for {
		cmd, err := readCommand(r)
		if err != nil {
			return
		}
		var out []byte
		switch name := cmd[0]; {
		case name == "HELLO":
			out = []byte("%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.0.0\r\n$5\r\nproto\r\n:3\r\n")
		case name == "CLIENT" || name == "SELECT" || name == "AUTH":
			out = []byte("+OK\r\n")
		case name == "PING":
			out = []byte("+PONG\r\n")
		case name == "SCRIPT" && len(cmd) == 3 && strings.EqualFold(cmd[1], "LOAD"):
			sum := sha1.Sum([]byte(cmd[2]))
			out = fmt.Appendf(nil, "$40\r\n%s\r\n", hex.EncodeToString(sum[:]))
		default:
			out = answer(cmd)
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// readCommand reads one command, an array of bulk strings, of at most
// 1 MiB.
func readCommand(r *bufio.Reader) ([]string, error) {
	n, err := readHeader(r, '*')
	if err != nil {
		return nil, err
	}
	if n < 1 || n > 1<<16 {
		return nil, fmt.Errorf("command of %d parts", n)
	}
	cmd := make([]string, n)
	for i := range cmd {
		m, err := readHeader(r, '$')
		if err != nil {
			return nil, err
		}
		if m < 0 || m > 1<<20 {
			return nil, fmt.Errorf("argument of %d bytes", m)
		}
		b := make([]byte, m+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		cmd[i] = string(b[:m])
	}
	cmd[0] = strings.ToUpper(cmd[0])
	return cmd, nil
}

func readHeader(r *bufio.Reader, kind byte) (int, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 4 || line[0] != kind {
		return 0, errors.New("not RESP")
	}
	return strconv.Atoi(strings.TrimRight(line[1:], "\r\n"))
}
