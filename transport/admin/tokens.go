package admin

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
)

// Caps on a tokens file.
const (
	// MaxTokensFileBytes caps a tokens file: 1 MiB.
	MaxTokensFileBytes = 1 << 20
	// MaxTokens caps the tokens of a file: 10,000.
	MaxTokens = 10_000
	// MinSecretBytes is the shortest secret accepted: 16 bytes, so that a
	// token cannot be guessed.
	MinSecretBytes = 16
	// maxTokenLine caps one line, as the file's cap allows.
	maxTokenLine = 4096
)

// Role is what a token may do.
type Role string

// The roles of tokens.
const (
	RoleRead  Role = "read"  // GET and dry runs (validate)
	RoleWrite Role = "write" // everything
)

// Token is one admin token: its name (the author of what it changes), its
// role, and the SHA-256 of its secret.
type Token struct {
	Name string
	Role Role
	hash [sha256.Size]byte
}

// Tokens are the admin tokens of a tokens file. They are immutable and
// safe for concurrent use.
type Tokens struct {
	list []Token
}

// LoadTokens reads a tokens file: one token a line, "NAME ROLE SECRET"
// separated by spaces or tabs, ROLE read or write, blank lines and lines
// starting with # ignored. Mistakes are reported all at once, each
// "file:line: what" (never with the secret); a file above
// MaxTokensFileBytes is refused before it is read.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("admin tokens: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTokensFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("admin tokens %s: %w", path, err)
	}
	return ParseTokens(path, b)
}

// ParseTokens reads a tokens file's contents as LoadTokens does; name
// stands for the file in errors.
func ParseTokens(name string, data []byte) (*Tokens, error) {
	if len(data) > MaxTokensFileBytes {
		return nil, fmt.Errorf("%s: too large: above the cap of %d bytes on a tokens file", name, MaxTokensFileBytes)
	}
	var errs []error
	bad := func(line int, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s:%d: %s", name, line, fmt.Sprintf(format, args...)))
	}
	ts := &Tokens{}
	names := map[string]int{}
	secrets := map[[sha256.Size]byte]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 1024), maxTokenLine)
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			bad(n, "%d fields; want NAME ROLE SECRET", len(f))
			continue
		}
		t := Token{Name: f[0], Role: Role(f[1]), hash: sha256.Sum256([]byte(f[2]))}
		ok := true
		if t.Role != RoleRead && t.Role != RoleWrite {
			bad(n, "role %q: want read or write", f[1])
			ok = false
		}
		if len(f[2]) < MinSecretBytes {
			bad(n, "the secret of %q is %d bytes; want at least %d", t.Name, len(f[2]), MinSecretBytes)
			ok = false
		}
		if first, dup := names[t.Name]; dup {
			bad(n, "token name %q repeated (first at line %d)", t.Name, first)
			ok = false
		}
		if first, dup := secrets[t.hash]; dup {
			bad(n, "the secret of %q is the one at line %d", t.Name, first)
			ok = false
		}
		if !ok {
			continue
		}
		names[t.Name], secrets[t.hash] = n, n
		if len(ts.list) >= MaxTokens {
			bad(n, "more than %d tokens", MaxTokens)
			break
		}
		ts.list = append(ts.list, t)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s:%d: %w (a line is at most %d bytes)", name, n+1, err, maxTokenLine))
	}
	if len(errs) == 0 && len(ts.list) == 0 {
		errs = append(errs, fmt.Errorf("%s: no tokens", name))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return ts, nil
}

// Lookup returns the token whose secret is secret. It compares secret's
// hash with every token's in constant time, whichever matches, so that
// the time it takes says nothing of the secrets.
func (ts *Tokens) Lookup(secret string) (Token, bool) {
	h := sha256.Sum256([]byte(secret))
	found := -1
	for i := range ts.list {
		if subtle.ConstantTimeCompare(h[:], ts.list[i].hash[:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Token{}, false
	}
	return ts.list[found], true
}

// TokenLookup finds the token of a secret; *Tokens and *TokensFile are
// ones.
type TokenLookup interface {
	Lookup(secret string) (Token, bool)
}

// TokensFile is a tokens file read again when it changes (its size,
// modification time or inode, checked on each Lookup), so that a token
// is revoked or added without a restart. A file that no longer reads
// (removed, unreadable, or with a mistake) revokes every token until it
// reads again: a revocation must not wait for an edit without mistakes,
// and onError is told why, once per change. It is safe for concurrent
// use.
type TokensFile struct {
	path    string
	onError func(error)
	mu      sync.Mutex
	stamp   fileStamp
	tokens  *Tokens // none when the file does not read
}

// fileStamp is what says a file changed; the zero stamp is a file that
// cannot be read.
type fileStamp struct {
	size  int64
	mtime int64
	ino   uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	st := fileStamp{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		st.ino = sys.Ino
	}
	return st
}

// WatchTokens reads the tokens file at path, failing as LoadTokens does,
// and reads it again when it changes.
func WatchTokens(path string, onError func(error)) (*TokensFile, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("admin tokens: %w", err)
	}
	ts, err := LoadTokens(path)
	if err != nil {
		return nil, err
	}
	if onError == nil {
		onError = func(error) {}
	}
	return &TokensFile{path: path, onError: onError, stamp: stampOf(fi), tokens: ts}, nil
}

// Lookup finds secret's token in the file as it is now; none while the
// file does not read.
func (tf *TokensFile) Lookup(secret string) (Token, bool) {
	tf.mu.Lock()
	var st fileStamp
	fi, err := os.Stat(tf.path)
	if err == nil {
		st = stampOf(fi)
	} else {
		err = fmt.Errorf("admin tokens: %w", err)
	}
	if st != tf.stamp {
		tf.stamp = st // one report per change
		if err == nil {
			tf.tokens, err = LoadTokens(tf.path)
		}
		if err != nil {
			tf.tokens = nil
			tf.onError(fmt.Errorf("%w; every admin token is refused until the file reads", err))
		}
	}
	ts := tf.tokens
	tf.mu.Unlock()
	if ts == nil {
		return Token{}, false
	}
	return ts.Lookup(secret)
}
