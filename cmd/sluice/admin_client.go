package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v4"

	"github.com/sluicehq/sluice/transport/admin"
)

// maxAdminReply caps what the CLI reads of one admin API answer: 64 MiB.
const maxAdminReply = 64 << 20

// clientFlags are the flags of the commands that call the admin API.
type clientFlags struct {
	url       string
	token     string
	tokenFile string
	timeout   time.Duration
}

func (c *clientFlags) register(fs *ff.FlagSet) {
	fs.StringVar(&c.url, 0, "admin-url", "http://127.0.0.1:8082", withEnv("admin-url", "the admin API of a sluice serve"))
	fs.StringVar(&c.token, 0, "admin-token", "", withEnv("admin-token", "the admin API token's secret (or --admin-token-file)"))
	fs.StringVar(&c.tokenFile, 0, "admin-token-file", "", withEnv("admin-token-file", "file holding the admin API token's secret"))
	fs.DurationVar(&c.timeout, 0, "admin-timeout", 30*time.Second, withEnv("admin-timeout", "longest wait for an answer of the admin API"))
}

// adminClient calls the admin API.
type adminClient struct {
	base   string
	secret string
	http   *http.Client
}

func (c *clientFlags) client() (*adminClient, error) {
	secret := c.token
	if secret == "" && c.tokenFile != "" {
		f, err := os.Open(c.tokenFile)
		if err != nil {
			return nil, usageError("--admin-token-file: %v", err)
		}
		b, err := io.ReadAll(io.LimitReader(f, admin.MaxTokensFileBytes))
		f.Close()
		if err != nil {
			return nil, usageError("--admin-token-file: %v", err)
		}
		secret = strings.TrimSpace(string(b))
	}
	if secret == "" {
		return nil, usageError("an admin token is needed: --admin-token, $SLUICE_ADMIN_TOKEN or --admin-token-file")
	}
	return &adminClient{base: strings.TrimRight(c.url, "/"), secret: secret, http: &http.Client{Timeout: c.timeout}}, nil
}

// apiError is an admin API's error answer.
type apiError struct {
	code int
	body struct {
		Error  string `json:"error"`
		Errors []struct {
			Text string `json:"text"`
		} `json:"errors"`
	}
}

func (e *apiError) Error() string {
	if len(e.body.Errors) > 0 {
		lines := make([]string, len(e.body.Errors))
		for i, m := range e.body.Errors {
			lines[i] = m.Text
		}
		return strings.Join(lines, "\n")
	}
	return fmt.Sprintf("%s (HTTP %d)", e.body.Error, e.code)
}

// do calls method path with body and headers (name, value pairs) and
// returns the answer's body and headers, or an *apiError for a status
// of 400 and above.
func (c *adminClient) do(ctx context.Context, method, path string, body []byte, header ...string) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("admin API: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.secret)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] != "" {
			req.Header.Set(header[i], header[i+1])
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAdminReply))
	if err != nil {
		return nil, nil, fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode >= 400 {
		e := &apiError{code: resp.StatusCode}
		if json.Unmarshal(b, &e.body) != nil || e.body.Error == "" {
			e.body.Error = strings.TrimSpace(string(b))
		}
		return nil, nil, e
	}
	return b, resp.Header, nil
}

// doJSON is do, decoding the answer into v.
func (c *adminClient) doJSON(ctx context.Context, v any, method, path string, body []byte, header ...string) (http.Header, error) {
	b, h, err := c.do(ctx, method, path, body, header...)
	if err != nil {
		return nil, err
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			return nil, fmt.Errorf("admin API answer: %w", err)
		}
	}
	return h, nil
}
