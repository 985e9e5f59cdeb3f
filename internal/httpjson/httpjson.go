// Package httpjson writes the JSON answers of sluice's HTTP handlers
// (transport/httpapi, observe, ui): a value as JSON, and an error as
// {"error": msg}.
package httpjson

import (
	"encoding/json"
	"net/http"
)

// Write answers v as JSON, followed by a newline, with status code; the
// headers w already has (a Cache-Control, say) are kept. If v does not
// encode, it answers Error 500 instead.
func Write(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		Error(w, http.StatusInternalServerError, "encode: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n')) //nolint:errcheck // the client went away; nothing to do
}

// Error answers {"error": msg}, followed by a newline, with status code,
// as JSON that browsers do not sniff as another type.
func Error(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(map[string]string{"error": msg}) // a map of strings always encodes
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	w.Write(append(b, '\n')) //nolint:errcheck // the client went away; nothing to do
}
