package httpjson

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestWrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		v        any
		code     int
		wantCode int
		body     string
		nosniff  string
	}{
		{"value", map[string]int{"a": 1}, http.StatusOK, http.StatusOK, "{\"a\":1}\n", ""},
		{"other code", []int{1}, http.StatusServiceUnavailable, http.StatusServiceUnavailable, "[1]\n", ""},
		{"does not encode", math.NaN(), http.StatusOK, http.StatusInternalServerError, "{\"error\":\"encode: json: unsupported value: NaN\"}\n", "nosniff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			w := httptest.NewRecorder()
			w.Header().Set("Cache-Control", "no-store")
			Write(w, tt.code, tt.v)
			if w.Code != tt.wantCode || w.Body.String() != tt.body {
				t.Errorf("Write = %d %q; want %d %q", w.Code, w.Body.String(), tt.wantCode, tt.body)
			}
			h := w.Header()
			if h.Get("Content-Type") != "application/json" || h.Get("Cache-Control") != "no-store" || h.Get("X-Content-Type-Options") != tt.nosniff {
				t.Errorf("headers = %v", h)
			}
		})
	}
}

func TestError(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	Error(w, http.StatusBadRequest, `bad "x"`)
	if w.Code != http.StatusBadRequest || w.Body.String() != "{\"error\":\"bad \\\"x\\\"\"}\n" {
		t.Errorf("Error = %d %q", w.Code, w.Body.String())
	}
	if h := w.Header(); h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("headers = %v", h)
	}
}
