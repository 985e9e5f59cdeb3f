package server

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// dashboardRules limit each user to 5 requests a minute.
const dashboardRules = `domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// pathRule limits path /login to 1 request a minute.
const pathRule = `  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// signupRule, nested under dashboardRules' user, limits each user's
// /signup to 1 a minute.
const signupRule = `    descriptors:
      - key: path
        value: /signup
        rate_limit: {unit: minute, requests_per_unit: 1}
`

// decidePath asks s's HTTP API for a decision on path and returns its
// overall code.
func decidePath(c *http.Client, url, path string) (string, error) {
	body := fmt.Sprintf(`{"domain":"api","descriptors":[{"entries":[{"key":"path","value":%q}]}]}`, path)
	resp, err := c.Post(url+"/v1/decide", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var v struct{ OverallCode string }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", err
	}
	return v.OverallCode, nil
}

// decideUser asks s's HTTP API for a decision on user and returns its
// overall code.
func decideUser(c *http.Client, url, user string) (string, error) {
	body := fmt.Sprintf(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":%q}]}]}`, user)
	resp, err := c.Post(url+"/v1/decide", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var v struct{ OverallCode string }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", err
	}
	return v.OverallCode, nil
}

// TestServeDashboardRoutes: serve answers /ui, /v1/top with the client it
// denied most, /v1/keys with its state, and logs its denials.
func TestServeDashboardRoutes(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// 5 a minute in a sliding log: a fixed window's turn of the minute
	// among the 8 requests would admit more than 5.
	writeFile(t, filepath.Join(dir, "rules.yaml"), strings.Replace(dashboardRules, "requests_per_unit: 5}", "requests_per_unit: 5, algorithm: sliding_log}", 1))
	c := testConfig(dir)
	c.Observe.DenyLogRate = 100
	s := startServer(t, c)
	for i := range 8 {
		code, err := decideUser(s.http, s.httpURL, "mallory")
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "OK", false: "OVER_LIMIT"}[i < 5]; code != want {
			t.Fatalf("request %d: %s, want %s", i, code, want)
		}
	}
	if r := s.do(t, "GET", "/ui/", ""); r.code != 200 || !strings.Contains(r.body, "uPlot.iife.min.js") {
		t.Errorf("/ui/: %d %.200s", r.code, r.body)
	}
	if r := s.do(t, "GET", "/ui/static/uplot/uPlot.iife.min.js", ""); r.code != 200 || len(r.body) < 40000 {
		t.Errorf("uPlot: %d, %d bytes", r.code, len(r.body))
	}
	r := s.do(t, "GET", "/v1/top?domain=api&key=user&by=denied&window=1m", "")
	var top struct {
		Clients []struct {
			Value string
			Count uint64
		}
		ErrorBound uint64 `json:"error_bound"`
	}
	if err := json.Unmarshal([]byte(r.body), &top); err != nil || r.code != 200 {
		t.Fatalf("/v1/top: %d %s", r.code, r.body)
	}
	if len(top.Clients) != 1 || top.Clients[0].Value != "mallory" || top.Clients[0].Count < 3 || top.Clients[0].Count > 3+top.ErrorBound {
		t.Errorf("/v1/top: %s, want mallory denied 3 times", r.body)
	}
	if r := s.do(t, "GET", "/v1/keys/api/user/mallory", ""); r.code != 200 || !strings.Contains(r.body, `"remaining":0`) || !strings.Contains(r.body, `"denies_next":true`) {
		t.Errorf("/v1/keys: %d %s", r.code, r.body)
	}
	eventually(t, "a denial logged", func() bool {
		l := s.logs.Find("denied")
		return l != nil && l["descriptor"] == "user=mallory" && l["limit"] == "5/1m0s sliding_log"
	})
}

// chromiumPath finds Debian's chromium (or Chrome). Without one the test
// skips, or fails under CI=true, where scripts/test.sh installs it.
func chromiumPath(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found; scripts/test.sh installs Debian's chromium package")
	}
	t.Skip("chromium not found (install Debian's chromium package; under CI=true this fails)")
	return ""
}

// TestDashboardBrowser opens /ui of a real `sluice serve` in a headless
// Chromium while a load runs: the page loads without console errors, its
// decisions per second move, it lists the load's top offender, and the
// simulator plots a fixed window's boundary burst. Screenshots are kept in
// a temporary directory the log names (and in $SLUICE_SCREENSHOT_DIR if
// set).
func TestDashboardBrowser(t *testing.T) {
	chromium := chromiumPath(t)
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "rules.yaml"), dashboardRules+signupRule+pathRule)
	c := testConfig(dir)
	c.Observe.DenyLogRate = -1
	s := startServer(t, c)
	signup := func(user string) error { // user with path=/signup: the nested rule
		body := fmt.Sprintf(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":%q},{"key":"path","value":"/signup"}]}]}`, user)
		resp, err := s.http.Post(s.httpURL+"/v1/decide", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}

	// The load: mallory sends five times as often as each of 50 others,
	// and path /login (a value with a slash) half as often as mallory.
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stopLoad(); wg.Wait() }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; loadCtx.Err() == nil; i++ {
			user := "mallory"
			if i%6 != 0 {
				user = fmt.Sprintf("user-%d", i%50)
			}
			if _, err := decideUser(s.http, s.httpURL, user); err != nil && loadCtx.Err() == nil {
				t.Errorf("load: %v", err)
				return
			}
			if i%12 == 0 { // denied half as often as mallory, more than any other user
				if _, err := decidePath(s.http, s.httpURL, "/login"); err != nil && loadCtx.Err() == nil {
					t.Errorf("load: %v", err)
					return
				}
			}
			if i%12 == 6 { // eve on /signup: denied by the nested rule, third
				if err := signup("eve"); err != nil && loadCtx.Err() == nil {
					t.Errorf("load: %v", err)
					return
				}
			}
			if i%20 == 0 {
				select { // about 200 decisions a second at most
				case <-loadCtx.Done():
				case <-time.After(100 * time.Millisecond):
				}
			}
		}
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	actx, cancelA := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.Headless,
		chromedp.WindowSize(1280, 800), chromedp.Flag("disable-gpu", true))...)
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()

	var mu sync.Mutex
	var problems []string
	// Console starts the browser and subscribes before it returns, so
	// that no message of the pages is lost (and the browser is not started
	// twice at once by Console and the first action).
	messages := chromedp.Console(bctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() || m.Type == chromedp.ConsoleWarning {
				mu.Lock()
				problems = append(problems, m.String()+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	run := func(what string, a chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(bctx, a); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	poll := func(what, expr string) {
		t.Helper()
		if _, err := chromedp.Run(bctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(45*time.Second), chromedp.WithPollingInterval(100*time.Millisecond))); err != nil {
			t.Fatalf("waiting for %s (%s): %v", what, expr, err)
		}
	}
	// The screenshots are the test's artefacts: kept after it ends, in a
	// temporary directory of their own that the log names.
	artefacts, err := os.MkdirTemp("", "sluice-dashboard-")
	if err != nil {
		t.Fatal(err)
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		for _, d := range []string{artefacts, os.Getenv("SLUICE_SCREENSHOT_DIR")} {
			if d == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(d, name), png, 0o644); err != nil {
				t.Fatal(err)
			}
			t.Logf("screenshot %s", filepath.Join(d, name))
		}
	}

	run("open /ui", chromedp.Navigate(s.httpURL+"/ui"))
	poll("decisions per second", `parseFloat(document.getElementById("rate-total").textContent) > 0`)
	poll("no decision without the store", `document.getElementById("store-fail").textContent === "none"`)
	total := func() string {
		return eval(`[...document.querySelectorAll("#rates tbody tr")].map(r => r.cells[3].textContent).join(",")`)
	}
	first := total()
	poll("the totals to move", fmt.Sprintf(`[...document.querySelectorAll("#rates tbody tr")].map(r => r.cells[3].textContent).join(",") != %q`, first))
	poll("mallory listed first", `(document.querySelector("#top tbody tr.top-row td.client") || {}).textContent === "user=mallory"`)
	poll("a chart drawn", `document.querySelectorAll("#rate-chart canvas").length > 0`)
	if os.Getenv("SLUICE_SCREENSHOT_DIR") != "" {
		// For docs/observability.md's picture, a chart of 20 polls.
		poll("20 points plotted", `times.length >= 20`)
	}
	if rules := eval(`document.querySelector("#rules tbody").textContent`); !strings.Contains(rules, "api.user") || !strings.Contains(rules, "5/minute fixed_window") {
		t.Errorf("rules table %q, want api.user 5/minute", rules)
	}
	if reloads := eval(`document.querySelector("#reloads tbody").textContent`); !strings.Contains(reloads, "loaded") {
		t.Errorf("reloads %q, want the first load", reloads)
	}
	if mode := eval(`document.getElementById("store-mode").textContent`); mode != "store" {
		t.Errorf("mode %q, want store", mode)
	}
	// The most limited clients, ranked by denials across keys, each with
	// its rule and limit; "why?" looks one up.
	poll("the top client's rule", `(document.querySelector("#top tbody tr.top-row td.rule") || {}).textContent === "api.user"`)
	if got := eval(`document.querySelector("#top tbody tr.top-row td.limit").textContent`); got != "5/1m0s" {
		t.Errorf("top client's limit %q, want 5/1m0s", got)
	}
	poll("/login listed second", `(document.querySelectorAll("#top tbody tr.top-row td.client")[1] || {}).textContent === "path=/login"`)
	if got := eval(`JSON.stringify([...document.querySelectorAll("#top tbody tr")].map(r => parseInt(r.cells[2].textContent)))`); !descending(got) {
		t.Errorf("denied column %s, want it ranked from most to least", got)
	}
	run("why? of /login", chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll("#top tbody tr")].find(r => r.cells[1].textContent === "path=/login").querySelector("button.why").click()`))
	lookedUp := func(what, entries, rule string) {
		t.Helper()
		poll(what, fmt.Sprintf(`(document.querySelector("#lookup-result tbody") || {}).textContent.includes(%q)`, entries))
		if got := eval(`document.querySelector("#lookup-result tbody").textContent`); !strings.Contains(got, rule) || !strings.Contains(got, "denied") {
			t.Errorf("%s: lookup %q, want %s denied under %s", what, got, entries, rule)
		}
	}
	lookedUp("/login looked up from the top", "path=/login", "api.path_/login")

	// A client denied by a nested rule is listed by the key that names it
	// (user=eve, not path=/signup, the same for every user) with that rule,
	// and "why?" looks up the descriptor it was denied with (issue 35: the
	// row was path=/signup, whose lookup alone matched no rule: "admitted").
	poll("eve listed with the nested rule", `[...document.querySelectorAll("#top tbody tr.top-row")].some(r => r.cells[1].textContent === "user=eve" && r.cells[3].textContent === "api.user.path_/signup" && r.cells[4].textContent === "1/1m0s")`)
	if got := eval(`[...document.querySelectorAll("#top tbody tr.top-row td.client")].map(c => c.textContent).join(",")`); strings.Contains(got, "path=/signup") {
		t.Errorf("top clients %q list path=/signup, the nested rule's fixed value", got)
	}
	run("why? of eve", chromedp.Evaluate[chromedp.Void](`[...document.querySelectorAll("#top tbody tr")].find(r => r.cells[1].textContent === "user=eve").querySelector("button.why").click()`))
	lookedUp("eve looked up from the top", "user=eve, path=/signup", "api.user.path_/signup")

	// A lookup that fails (the store down for a moment) says so and is
	// asked again at the next poll, not kept as "no rule" until the rules
	// change (issue 35).
	eval(`ruleOf.clear(); window.failKeys = 3; window.realFetch = window.realFetch || window.fetch; ` +
		`window.fetch = (u, o) => String(u).includes("/v1/keys/") && window.failKeys-- > 0 ? ` +
		`Promise.resolve(new Response('{"error":"store unavailable"}', {status: 503, headers: {"Content-Type": "application/json"}})) : window.realFetch(u, o); ""`)
	poll("a failed lookup shown", `[...document.querySelectorAll("#top tbody tr.top-row td.limit")].some(c => c.textContent.startsWith("lookup failed: store unavailable"))`)
	poll("the rule named again once lookups work", `window.failKeys < 0 && (document.querySelector("#top tbody tr.top-row td.rule") || {}).textContent === "api.user"`)

	// Typed: a value as sent, a slash and all.
	typed := func(what, key, value string) {
		t.Helper()
		eval(`document.querySelector("#lookup-result tbody").textContent = ""; document.getElementById("lookup-domain").value = ""; ` +
			`document.getElementById("lookup-entries").textContent = ""; addPair(); ""`)
		run(what, chromedp.Steps(
			chromedp.SendKeys("#lookup-domain", "api"),
			chromedp.SendKeys("#lookup .lookup-key", key),
			chromedp.SendKeys("#lookup .lookup-value", value),
			chromedp.Click(`#lookup button[type=submit]`)))
	}
	typed("look mallory up", "user", "mallory")
	lookedUp("mallory's state", "user=mallory", "api.user")
	typed("look /login up", "path", "/login")
	lookedUp("/login's state", "path=/login", "api.path_/login")
	eval(`window.scrollTo(0, 0); ""`)
	shot("dashboard.png")

	run("open /ui/simulate", chromedp.Navigate(s.httpURL+"/ui/simulate"))
	poll("the simulation's charts", `document.querySelectorAll("#charts .sim-card canvas").length >= 2`)
	if got := eval(`JSON.stringify(window.simResult.series.map(s => [s.limit, s.admitted[59], s.admitted[60], s.max_admitted_window]))`); got != `[["100/1m0s",100,100,200],["100/1m0s sliding_window",100,0,100]]` {
		t.Errorf("simulation %s, want fixed window 100+100 at the boundary, sliding 100+0", got)
	}
	if sum := eval(`document.querySelector(".sim-card .sim-summary").textContent`); !strings.Contains(sum, "in one period 200") {
		t.Errorf("fixed window's summary %q, want 200 in one period", sum)
	}
	shot("simulate.png")

	mu.Lock()
	defer mu.Unlock()
	if len(problems) > 0 {
		t.Errorf("console: %s", strings.Join(problems, "\n"))
	}
}

// descending reports whether the JSON list of numbers got is not empty
// and ranked from most to least.
func descending(got string) bool {
	var ns []int
	if err := json.Unmarshal([]byte(got), &ns); err != nil || len(ns) == 0 {
		return false
	}
	for i := 1; i < len(ns); i++ {
		if ns[i] > ns[i-1] {
			return false
		}
	}
	return true
}

// TestServeFloodGuard: with FloodGuard a client's first request is not
// counted (the stated cost), so a limit of 5 admits 6; without, 5.
func TestServeFloodGuard(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		guard bool
		want  int
	}{{false, 5}, {true, 6}} {
		dir := t.TempDir()
		writeFile(t, filepath.Join(dir, "rules.yaml"), dashboardRules)
		c := testConfig(dir)
		c.Store.FloodGuard = tc.guard
		s := startServer(t, c)
		admitted := 0
		for range 8 {
			code, err := decideUser(s.http, s.httpURL, "alice")
			if err != nil {
				t.Fatal(err)
			}
			if code == "OK" {
				admitted++
			}
		}
		if admitted != tc.want {
			t.Errorf("flood guard %v: admitted %d of 8, want %d", tc.guard, admitted, tc.want)
		}
	}
}
