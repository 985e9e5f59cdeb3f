package docs_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// module is the module's path, which the table's package names omit.
const module = "github.com/sluicehq/sluice"

// arrowRow is a row of contributing.md's import arrows: the packages it
// names and what they may import (nil and any: anything).
type arrowRow struct {
	pkgs, allowed []string
	any           bool
}

// readArrows returns the rows of the table under "### Import arrows" in
// the Markdown file path.
func readArrows(t *testing.T, path string) []arrowRow {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Import arrows\n")
	if !ok {
		t.Fatalf("%s has no section Import arrows", path)
	}
	code := regexp.MustCompile("`([^`]+)`")
	names := func(cell string) []string {
		var out []string
		for _, m := range code.FindAllStringSubmatch(cell, -1) {
			out = append(out, m[1])
		}
		return out
	}
	var rows []arrowRow
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !strings.HasPrefix(line, "| `") || len(cells) != 2 {
			continue
		}
		r := arrowRow{pkgs: names(cells[0]), allowed: names(cells[1]), any: strings.TrimSpace(cells[1]) == "anything"}
		if len(r.pkgs) == 0 || (len(r.allowed) == 0 && !r.any && strings.TrimSpace(cells[1]) != "nothing") {
			t.Fatalf("%s: row %q: want `packages` | `may import` (or nothing, or anything)", path, line)
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no rows under Import arrows", path)
	}
	return rows
}

// matches reports whether pattern (a package, or x/... for x and those
// under it) names pkg, and how closely: the longer, the closer; an exact
// name beats every pattern.
func matches(pattern, pkg string) (bool, int) {
	if pattern == pkg {
		return true, 1 << 20
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok && (pkg == base || strings.HasPrefix(pkg, base+"/")) {
		return true, len(base)
	}
	return false, 0
}

// imports returns the module's packages under root (by their names in
// the table: "sluice" for the root) and the module's packages each one's
// non-test files import. Directories named testdata, or starting with .
// or _, and other modules (deploy/) are left out.
func imports(t *testing.T, root string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || exists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(rel)
		if pkg == "." {
			pkg = "sluice"
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		if _, ok := out[pkg]; !ok {
			out[pkg] = nil
		}
		for _, is := range f.Imports {
			p, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return err
			}
			switch {
			case p == module:
				p = "sluice"
			case strings.HasPrefix(p, module+"/"):
				p = strings.TrimPrefix(p, module+"/")
			default:
				continue
			}
			if !slices.Contains(out[pkg], p) {
				out[pkg] = append(out[pkg], p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// TestArrows checks every import between the module's packages against
// contributing.md's table of import arrows, which mirrors DESIGN.md's
// package table: a package imports only what its row allows, and every
// package has a row.
func TestArrows(t *testing.T) {
	t.Parallel()
	rows := readArrows(t, "contributing.md")
	pkgs := imports(t, "..")
	if len(pkgs) < 20 {
		t.Fatalf("found %d packages, want the module's", len(pkgs))
	}
	names := make([]string, 0, len(pkgs))
	for p := range pkgs {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, pkg := range names {
		var row *arrowRow
		best := 0
		for i := range rows {
			for _, p := range rows[i].pkgs {
				if ok, n := matches(p, pkg); ok && n > best {
					row, best = &rows[i], n
				}
			}
		}
		if row == nil {
			t.Errorf("package %s has no row in contributing.md's import arrows", pkg)
			continue
		}
		if row.any {
			continue
		}
		for _, imp := range pkgs[pkg] {
			allowed := strings.HasPrefix(imp, "internal/") && !strings.HasPrefix(pkg, "internal/")
			for _, a := range row.allowed {
				ok, _ := matches(a, imp)
				allowed = allowed || ok
			}
			if !allowed {
				t.Errorf("%s imports %s; its row (%s) allows %s", pkg, imp, strings.Join(row.pkgs, ", "), strings.Join(row.allowed, ", "))
			}
		}
	}
}

// TestArrowsMatch checks how a package finds its row.
func TestArrowsMatch(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, pkg string
		ok           bool
	}{
		{"store/...", "store/redis", true},
		{"store/...", "store", true},
		{"store/...", "storetest", false},
		{"store/redis", "store/redis", true},
		{"store/redis", "store/redis/x", false},
	} {
		if ok, _ := matches(tc.pattern, tc.pkg); ok != tc.ok {
			t.Errorf("matches(%q, %q) = %v, want %v", tc.pattern, tc.pkg, ok, tc.ok)
		}
	}
	if _, exact := matches("store/redis", "store/redis"); exact <= len("store/redis/...") {
		t.Error("an exact name does not beat a pattern")
	}
}
