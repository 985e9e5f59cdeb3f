package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/peterbourgon/ff/v4"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/internal/yamlerr"
	"github.com/sluicehq/sluice/rules"
)

// configFlag is the flag that names a config file: --config, or
// $SLUICE_CONFIG.
const configFlag = "config"

// maxConfigBytes caps a config file: a file of every flag's setting is
// a few kilobytes.
const maxConfigBytes = 1 << 20

// configCommands are the subcommands that take --config.
var configCommands = map[string]bool{"serve": true, "proxy": true}

// addConfigFlag adds --config to the flag set of each command that takes a
// config file.
func addConfigFlag(cmds []*ff.Command) {
	for _, c := range cmds {
		fs, ok := c.Flags.(*ff.FlagSet)
		if !ok || !configCommands[c.Name] {
			continue
		}
		fs.StringVar(new(string), 0, configFlag, "", withEnv(configFlag,
			"YAML file of settings: flag names as keys (grpc-addr: \":8081\"); flags and the environment win over it"))
	}
}

// configure sets every flag of fs, the flags of the subcommand cmd, not
// given on the command line, from the first layer that has it: the flag's
// SLUICE_ environment variable, then (for serve) Envoy ratelimit's
// environment when it is in use, then the file that --config names. Each
// layer is checked whole, even where a higher layer wins, so a mistake in
// the file is reported although a flag hides it. It returns what Envoy's
// environment set, or nil.
func configure(cmd string, fs ff.Flags, getenv func(string) string) (*envoyEnv, error) {
	if err := applyEnv(fs, getenv); err != nil {
		return nil, usageError("%v", err)
	}
	var envoy *envoyEnv
	if cmd == "serve" {
		var err error
		if envoy, err = envoySettings(getenv); err != nil {
			return nil, err
		}
		if envoy != nil {
			if err := envoy.apply(fs); err != nil {
				return nil, err
			}
		}
	}
	f, ok := fs.GetFlag(configFlag)
	if !ok || f.GetValue() == "" {
		return envoy, nil
	}
	path := f.GetValue()
	data, err := readConfig(path)
	if err != nil {
		return nil, usageError("--config: %v", err)
	}
	if err := applyConfig(fs, path, data); err != nil {
		return nil, &exitError{code: 2, msg: err.Error()}
	}
	return envoy, nil
}

// readConfig reads the file at path, refusing one over maxConfigBytes.
func readConfig(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxConfigBytes)
	}
	return data, nil
}

// applyConfig sets the flags of fs not set yet from data, the YAML config
// file called name: one mapping whose keys are flag names and whose values
// are what the flag would be given (a list is joined with commas). It
// returns every mistake as a rules.Errors of file:line messages: a key that
// names no flag, a value the flag refuses, a key given twice, anything but
// a mapping of scalars.
func applyConfig(fs ff.Flags, name string, data []byte) error {
	var errs rules.Errors
	errorf := func(line int, format string, args ...any) {
		errs = append(errs, &rules.Error{File: name, Line: line, Msg: fmt.Sprintf(format, args...)})
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file sets nothing
		}
		line, msg := yamlerr.Locate(data, err)
		errorf(line, "%s", msg)
		return errs
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		errorf(extra.Line, "more than one YAML document: a config file holds one mapping")
		return errs
	}
	if len(doc.Content) == 0 || doc.Content[0].ShortTag() == "!!null" {
		return nil
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		errorf(top.Line, "want a mapping of flag names to values, got %s", describeNode(top))
		return errs
	}
	seen := map[string]int{}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			errorf(k.Line, "want a flag name as key, got %s", describeNode(k))
			continue
		}
		key := k.Value
		if first, dup := seen[key]; dup {
			errorf(k.Line, "%s: given twice (first on line %d)", key, first)
			continue
		}
		seen[key] = k.Line
		if key == configFlag {
			errorf(k.Line, "%s: a config file cannot name another", key)
			continue
		}
		f, ok := fs.GetFlag(key)
		if !ok || !isLongName(f, key) {
			errorf(k.Line, "%s: unknown setting%s", key, suggest(fs, key))
			continue
		}
		val, err := configValue(v)
		if err != nil {
			errorf(v.Line, "%s: %v", key, err)
			continue
		}
		if err := setChecked(f, val); err != nil {
			errorf(v.Line, "%s: %v", key, err)
		}
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// isLongName reports whether key is f's long name (GetFlag also finds a
// one-letter key by a flag's short name).
func isLongName(f ff.Flag, key string) bool {
	n, ok := f.GetLongName()
	return ok && n == key
}

// setChecked sets f to val if f is not set yet; if it is (by a flag or the
// environment, which win), it checks val as f would take it and keeps the
// value f has.
func setChecked(f ff.Flag, val string) error {
	if !f.IsSet() {
		return f.SetValue(val)
	}
	keep := f.GetValue()
	err := f.SetValue(val)
	if rerr := f.SetValue(keep); rerr != nil {
		return fmt.Errorf("restore %q: %w", keep, rerr)
	}
	return err
}

// configValue returns the flag value that n, a config file's value,
// stands for: a scalar as written, a list of scalars joined with commas.
func configValue(n *yaml.Node) (string, error) {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "", errors.New("no value")
		}
		return n.Value, nil
	case yaml.SequenceNode:
		parts := make([]string, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode || c.ShortTag() == "!!null" {
				return "", fmt.Errorf("want a list of values, got %s in it", describeNode(c))
			}
			if strings.Contains(c.Value, ",") {
				return "", fmt.Errorf("list item %q holds a comma", c.Value)
			}
			parts = append(parts, c.Value)
		}
		return strings.Join(parts, ","), nil
	}
	return "", fmt.Errorf("want a value, got %s", describeNode(n))
}

// describeNode names what a YAML node holds, for messages.
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		if n.ShortTag() == "!!null" {
			return "nothing"
		}
		return strconv.Quote(n.Value)
	}
	return "a YAML document"
}

// suggest returns " (did you mean --x?)" for the flag of fs closest to
// key, or "" when none is close.
func suggest(fs ff.Flags, key string) string {
	var names []string
	fs.WalkFlags(func(f ff.Flag) error { //nolint:errcheck // the walk returns no error
		if n, ok := f.GetLongName(); ok && n != configFlag {
			names = append(names, n)
		}
		return nil
	})
	sort.Strings(names)
	best, bestD := "", 3 // at most two edits away
	for _, n := range names {
		if d := editDistance(key, n); d < bestD {
			best, bestD = n, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %s?)", best)
}

// editDistance returns the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
