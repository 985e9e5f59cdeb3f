package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Caps on the bytes Load reads, checked before any YAML is parsed: parsing
// holds several times a file's size in memory, so a huge file is refused
// by its size rather than by the node cap after the memory is spent.
const (
	// DefaultMaxFileBytes is the cap on one rules file: 16 MiB, hundreds of
	// times the largest hand-written rules, with room for generated ones.
	DefaultMaxFileBytes = 16 << 20
	// DefaultMaxTotalBytes is the cap on all the rules files of a
	// directory together: 64 MiB.
	DefaultMaxTotalBytes = 64 << 20
)

// Loader reads rules files. The zero Loader reads as Load documents, with
// the default caps; a Loader is a value and safe for concurrent use.
type Loader struct {
	// MaxFileBytes caps the size of one rules file: a larger file is
	// refused, before it is parsed, with an Error naming it and the cap.
	// Zero or negative means DefaultMaxFileBytes (16 MiB).
	MaxFileBytes int64
	// MaxTotalBytes caps the sizes of all the rules files of a directory
	// together. Zero or negative means DefaultMaxTotalBytes (64 MiB).
	MaxTotalBytes int64
	// EnvoyLayout reads a directory as Envoy's ratelimit reads its runtime
	// directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config): every file
	// below it, whatever its name or extension, in subdirectories too, in
	// lexical order of their paths. A symbolic link to a file is read; one
	// to a directory is not followed (as Envoy's walk does), though the
	// directory at path itself may be one. Hidden entries are read too
	// unless IgnoreDotFiles is set. False (the default) reads the *.yaml and
	// *.yml files of the directory itself, skipping hidden entries.
	EnvoyLayout bool
	// IgnoreDotFiles skips, in the EnvoyLayout, files and directories whose
	// names start with a dot: Envoy's RUNTIME_IGNOREDOTFILES, which a
	// Kubernetes ConfigMap mount needs (its ..data and ..timestamped
	// entries would otherwise be read beside the links to them).
	IgnoreDotFiles bool
	// MergeDomains lets one domain be stated in several documents or
	// files, as Envoy's ratelimit does with MERGE_DOMAIN_CONFIG: their
	// top-level descriptors are joined, in file order, and must not repeat
	// a key and value. False (the default) refuses a repeated domain.
	MergeDomains bool
	// EnvoyDomainNames lets NewSet take domain names as Envoy's ratelimit
	// does (CheckEnvoyDomain: Envoy Gateway names its domains
	// namespace/gateway/listener), for rules that are never kept in files
	// or a rules database (xDS). False (the default) takes CheckDomain's.
	EnvoyDomainNames bool
}

// maxFile returns the cap on one file, the default when unset.
func (ld Loader) maxFile() int64 {
	if ld.MaxFileBytes <= 0 {
		return DefaultMaxFileBytes
	}
	return ld.MaxFileBytes
}

// maxTotal returns the cap on a directory, the default when unset.
func (ld Loader) maxTotal() int64 {
	if ld.MaxTotalBytes <= 0 {
		return DefaultMaxTotalBytes
	}
	return ld.MaxTotalBytes
}

// Load reads the rules at path with the zero Loader: a file, or a directory
// whose *.yaml and *.yml files are read (not its subdirectories, and not
// hidden entries such as Kubernetes' ..data, though the symlinks a
// ConfigMap mount makes to ..data/NAME are followed). A file may hold
// several domains as YAML documents separated by ---; a domain must not
// appear twice. A file above 16 MiB, or a directory whose files add up to
// more than 64 MiB, is refused before it is parsed.
//
// Mistakes in the rules are returned all at once as Errors, each
// "file:line: what is wrong"; a file that cannot be read is an error
// wrapping the os error.
func Load(path string) (*Set, error) { return Loader{}.Load(path) }

// Load reads the rules at path as the package's Load does, with ld's caps.
func (ld Loader) Load(path string) (*Set, error) {
	srcs, err := ld.readSources(path)
	if err != nil {
		var es Errors
		if errors.As(err, &es) {
			return nil, es
		}
		return nil, fmt.Errorf("load rules %s: %w", path, err)
	}
	if len(srcs) == 0 {
		what := "no *.yaml or *.yml files"
		if ld.EnvoyLayout {
			what = "no files"
		}
		return nil, Errors{{File: path, Msg: noRulesMsg + what}}
	}
	return ld.build(srcs)
}

// noRulesMsg starts the message of a directory without rules files.
const noRulesMsg = "no rules: the directory has "

// isNoRules reports whether err is Load's of a directory without rules
// files.
func isNoRules(err error) bool {
	var es Errors
	return errors.As(err, &es) && len(es) == 1 && strings.HasPrefix(es[0].Msg, noRulesMsg)
}

// Parse reads one rules file's contents; name stands for the file in
// errors. It is Load for rules that do not come from a file, and refuses
// data above DefaultMaxFileBytes as Load does.
func Parse(name string, data []byte) (*Set, error) { return Loader{}.Parse(name, data) }

// Parse reads one rules file's contents as the package's Parse does, with
// ld's cap on a file.
func (ld Loader) Parse(name string, data []byte) (*Set, error) {
	if int64(len(data)) > ld.maxFile() {
		return nil, Errors{ld.tooLarge(name, int64(len(data)))}
	}
	return ld.build([]source{{name, data}})
}

// tooLarge is the Error of a file of size bytes above the cap; size is
// negative when the file grew past the cap while it was read.
func (ld Loader) tooLarge(name string, size int64) *Error {
	what := "more than"
	if size >= 0 {
		what = fmt.Sprintf("%d bytes, above", size)
	}
	return &Error{File: name, Msg: fmt.Sprintf("too large: %s the cap of %s on one rules file", what, byteSize(ld.maxFile()))}
}

// byteSize writes n bytes for messages: "16 MiB (16777216 bytes)" when n
// is whole MiB, else "n bytes".
func byteSize(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB (%d bytes)", n>>20, n)
	}
	return fmt.Sprintf("%d bytes", n)
}

// readSources reads the rules file at path, or the rules files in the
// directory at path, sorted by name, refusing any above the caps with
// Errors.
func (ld Loader) readSources(path string) ([]source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		src, err := ld.readFile(path)
		if err != nil {
			return nil, err
		}
		return []source{src}, nil
	}
	names, err := ld.rulesFiles(path)
	if err != nil {
		return nil, err
	}
	var srcs []source
	var total int64
	for _, name := range names {
		fi, err := os.Stat(name) // follows symlinks, as into ..data
		if err != nil {
			return nil, err
		}
		if fi.IsDir() {
			continue
		}
		if total+fi.Size() > ld.maxTotal() {
			rel, _ := filepath.Rel(path, name)
			return nil, Errors{{File: path, Msg: fmt.Sprintf("too large: its rules files add up to more than the cap of %s on a directory (reached at %s)", byteSize(ld.maxTotal()), rel)}}
		}
		src, err := ld.readFile(name)
		if err != nil {
			return nil, err
		}
		total += int64(len(src.data))
		srcs = append(srcs, src)
	}
	if total > ld.maxTotal() {
		return nil, Errors{{File: path, Msg: fmt.Sprintf("too large: its rules files add up to more than the cap of %s on a directory", byteSize(ld.maxTotal()))}}
	}
	return srcs, nil
}

// rulesFiles lists the names of the files Load reads in the directory at
// path, sorted: its *.yaml and *.yml files, or with EnvoyLayout every file
// below it. Entries that are directories behind symbolic links may remain
// in the list; the caller skips them.
func (ld Loader) rulesFiles(path string) ([]string, error) {
	var names []string
	if !ld.EnvoyLayout {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if isRulesFile(e.Name()) {
				names = append(names, filepath.Join(path, e.Name()))
			}
		}
		return names, nil
	}
	root, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, err
	}
	err = filepath.WalkDir(root, func(name string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name != root && ld.IgnoreDotFiles && strings.HasPrefix(e.Name(), ".") {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if e.IsDir() {
			return nil
		}
		rel, err := filepath.Rel(root, name)
		if err != nil {
			return err
		}
		names = append(names, filepath.Join(path, rel))
		return nil
	})
	return names, err
}

// readFile reads one rules file, refusing it when it is larger than the
// cap: by its size before reading, and while reading, should it grow or
// not report its size.
func (ld Loader) readFile(name string) (source, error) {
	f, err := os.Open(name)
	if err != nil {
		return source{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return source{}, err
	}
	if fi.Size() > ld.maxFile() {
		return source{}, Errors{ld.tooLarge(name, fi.Size())}
	}
	data, err := io.ReadAll(io.LimitReader(f, ld.maxFile()+1))
	if err != nil {
		return source{}, err
	}
	if int64(len(data)) > ld.maxFile() {
		return source{}, Errors{ld.tooLarge(name, -1)}
	}
	return source{name, data}, nil
}

// isRulesFile reports whether a directory entry's name is one Load reads:
// not hidden, ending in .yaml or .yml.
func isRulesFile(name string) bool {
	if strings.HasPrefix(name, ".") {
		return false
	}
	ext := strings.ToLower(filepath.Ext(name))
	return ext == ".yaml" || ext == ".yml"
}

// build decodes and validates srcs into a Set.
func (ld Loader) build(srcs []source) (*Set, error) {
	var errs Errors
	var parsed []*parsedDomain
	h := sha256.New()
	for _, src := range srcs {
		fmt.Fprintf(h, "%d:%s%d:", len(src.name), src.name, len(src.data))
		h.Write(src.data)
		specs, c := decodeFile(src, &errs)
		for _, ds := range specs {
			if c.rp.over {
				break
			}
			if p := c.domain(ds, ""); p != nil {
				parsed = append(parsed, p)
			}
		}
	}
	s := assemble(parsed, ld.MergeDomains, &errs)
	if len(errs) > 0 {
		errs.sort()
		return nil, errs
	}
	s.version = hex.EncodeToString(h.Sum(nil)[:8])
	return s, nil
}
