package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the most lines a function of the module may span, from
// its func keyword to its closing brace (STYLE.md: functions stay under
// about 80 lines; a table beats a long switch).
const maxFuncLines = 80

// longFuncs are the functions allowed beyond maxFuncLines for now, by
// file and name ("decide/decide.go (*Service).decide"), each with the
// reason: an entry is removed when its function is split (the test says
// so in its log, without failing, so that whoever splits one lands
// without waiting on this list). None today.
var longFuncs = map[string]string{}

// funcName returns fd's name as Go's stack traces write it: Name, or
// Recv.Name, or (*Recv).Name.
func funcName(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return fd.Name.Name
	}
	typ := fd.Recv.List[0].Type
	if ix, ok := typ.(*ast.IndexExpr); ok { // a generic type's receiver
		typ = ix.X
	}
	if star, ok := typ.(*ast.StarExpr); ok {
		if ix, ok := star.X.(*ast.IndexExpr); ok {
			return "(*" + ix.X.(*ast.Ident).Name + ")." + fd.Name.Name
		}
		return "(*" + star.X.(*ast.Ident).Name + ")." + fd.Name.Name
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fd.Name.Name
	}
	return fd.Name.Name
}

// TestFunctionLength checks that no function outside tests spans more
// than maxFuncLines lines but those of longFuncs.
func TestFunctionLength(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != ".." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || exists(filepath.Join(path, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel("..", path)
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			name := filepath.ToSlash(rel) + " " + funcName(fd)
			if _, ok := longFuncs[name]; ok {
				seen[name] = true
				if n <= maxFuncLines {
					t.Logf("%s: %d lines: remove it from longFuncs", name, n)
				}
				continue
			}
			if n > maxFuncLines {
				t.Errorf("%s:%d: %s spans %d lines, more than %d: split it by concern", rel, fset.Position(fd.Pos()).Line, funcName(fd), n, maxFuncLines)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range longFuncs {
		if !seen[name] {
			t.Logf("%s is in longFuncs but not in the module: remove it", name)
		}
	}
}
