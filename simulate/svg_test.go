package simulate_test

import (
	"bytes"
	"encoding/xml"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/simulate"
)

// svgDoc is what the tests read back of an SVG report.
type svgDoc struct {
	XMLName xml.Name `xml:"http://www.w3.org/2000/svg svg"`
	Title   string   `xml:"title"`
	Groups  []struct {
		Class    string `xml:"class,attr"`
		Limit    string `xml:"data-limit,attr"`
		Admitted int64  `xml:"data-admitted,attr"`
		Denied   int64  `xml:"data-denied,attr"`
		Frame    struct {
			Y      float64 `xml:"y,attr"`
			Height float64 `xml:"height,attr"`
		} `xml:"rect"`
		Texts []string `xml:"text"`
		Paths []struct {
			Class string `xml:"class,attr"`
			D     string `xml:"d,attr"`
		} `xml:"path"`
	} `xml:"g"`
}

// tops reads the first n V commands of a path's d: the columns' tops, left
// to right.
func tops(t *testing.T, d string, n int) []float64 {
	t.Helper()
	var out []float64
	for _, f := range strings.Fields(d) {
		if len(out) == n {
			break
		}
		if v, ok := strings.CutPrefix(f, "V"); ok {
			y, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("path %q: %v", d, err)
			}
			out = append(out, y)
		}
	}
	if len(out) != n {
		t.Fatalf("path with %d columns, want %d", len(out), n)
	}
	return out
}

// TestSVG: the SVG report parses as SVG, has a panel per limit with its
// totals, and its columns, read back from the paths, are what each
// limit admitted and denied in each second (or bucket of seconds): the
// fixed window's boundary burst of 100 and 100, the sliding window's 100
// and then denials.
func TestSVG(t *testing.T) {
	t.Parallel()
	set, err := rules.Parse("r.yaml", []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := simulate.Targets(set, sluice.SlidingWindow)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, traffic string
		bucket        int
	}{
		{"boundary", boundary, 1},
		{"long", "steady 1/s 1000s; " + boundary + "; steady 2/s 1500s", 30}, // 2565 s: 30 s a column
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p, err := simulate.ParseTraffic(tc.traffic)
			if err != nil {
				t.Fatal(err)
			}
			res := simulate.Run(p, ts)
			var buf bytes.Buffer
			if err := simulate.WriteSVG(&buf, tc.traffic+` <&"x">`, res); err != nil {
				t.Fatal(err)
			}
			var doc svgDoc
			if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
				t.Fatalf("not XML: %v", err)
			}
			if !strings.Contains(doc.Title, `<&"x">`) || len(doc.Groups) != len(res.Series) {
				t.Fatalf("title %q, %d panels; want the traffic and %d", doc.Title, len(doc.Groups), len(res.Series))
			}
			bucket, cols := simulate.SVGColumns(res.Seconds)
			if bucket != tc.bucket || cols != (res.Seconds+bucket-1)/bucket {
				t.Fatalf("%d s in %d columns of %d s, want columns of %d", res.Seconds, cols, bucket, tc.bucket)
			}
			col := func(v []int64, c int) (n int64) {
				for _, x := range v[c*bucket : min((c+1)*bucket, len(v))] {
					n += x
				}
				return n
			}
			var top int64
			for _, s := range res.Series {
				for c := range cols {
					top = max(top, col(s.Admitted, c)+col(s.Denied, c))
				}
			}
			for i, g := range doc.Groups {
				s := res.Series[i]
				var adm, den int64
				for k := range s.Admitted {
					adm, den = adm+s.Admitted[k], den+s.Denied[k]
				}
				if g.Class != "series" || g.Limit != s.Limit || g.Admitted != adm || g.Denied != den || len(g.Paths) != 2 ||
					g.Paths[0].Class != "admitted" || g.Paths[1].Class != "denied" || !strings.Contains(g.Texts[0], s.Name) {
					t.Fatalf("panel %d: %+v, want %s with %d admitted, %d denied", i, g, s.Name, adm, den)
				}
				base, scale := g.Frame.Y+g.Frame.Height, g.Frame.Height/float64(top)
				at := tops(t, g.Paths[0].D, cols)
				upto := tops(t, g.Paths[1].D, cols)
				for c := range cols {
					a := int64(math.Round((base - at[c]) / scale))
					d := int64(math.Round((base-upto[c])/scale)) - a
					if a != col(s.Admitted, c) || d != col(s.Denied, c) {
						t.Fatalf("panel %d column %d: %d admitted, %d denied; want %d, %d", i, c, a, d, col(s.Admitted, c), col(s.Denied, c))
					}
				}
			}
			if tc.name == "boundary" {
				fixed, sliding := res.Series[0], res.Series[1]
				if fixed.Admitted[59] != 100 || fixed.Admitted[60] != 100 || sliding.Denied[60] < 98 {
					t.Fatalf("the simulation changed: fixed %d, %d; sliding denied %d", fixed.Admitted[59], fixed.Admitted[60], sliding.Denied[60])
				}
			}
		})
	}
}

// FuzzSVGTitle: whatever the title (the traffic spec or a log's path),
// the report is well-formed XML that keeps it.
func FuzzSVGTitle(f *testing.F) {
	for _, seed := range []string{boundary, `<script>&"'`, "\x00\xff\ufffe", "]]>"} {
		f.Add(seed)
	}
	res := simulate.Result{Seconds: 2, Requests: 1, Series: []simulate.Series{{Name: "n", Limit: "1/1s", Admitted: []int64{1, 0}, Denied: []int64{0, 0}, Reached: true}}}
	f.Fuzz(func(t *testing.T, title string) {
		var buf bytes.Buffer
		if err := simulate.WriteSVG(&buf, title, res); err != nil {
			t.Fatal(err)
		}
		var doc svgDoc
		if err := xml.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatalf("title %q: %v", title, err)
		}
		if len(doc.Groups) != 1 || !strings.HasPrefix(doc.Title, "sluice simulate: ") {
			t.Fatalf("title %q: %+v", title, doc)
		}
	})
}
