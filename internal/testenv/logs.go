package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"sync"
)

// Logs collects a server's JSON log lines (slog's JSONHandler writes
// one record a line); safe for concurrent use.
type Logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Find returns the first log record whose message (Message) is msg, or
// nil.
func (l *Logs) Find(msg string) map[string]any {
	return l.FindFunc(msg, func(map[string]any) bool { return true })
}

// FindFunc returns the first log record whose msg is msg and for which ok
// holds, or nil.
func (l *Logs) FindFunc(msg string, ok func(rec map[string]any) bool) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && Message(rec) == msg && ok(rec) {
			return rec
		}
	}
	return nil
}

// Message returns a JSON log record's message: slog's "msg", or
// "@message" as Envoy ratelimit's logs (sluice's --log-format envoy) name
// it.
func Message(rec map[string]any) string {
	if m, ok := rec["msg"].(string); ok {
		return m
	}
	m, _ := rec["@message"].(string)
	return m
}
