// Package yamlerr reads the errors of the YAML parser (gopkg.in/yaml.v3)
// for the file:line reports of the rule and configuration files.
package yamlerr

import (
	"strconv"
	"strings"
)

// Split splits the YAML parser's "yaml: line N: msg" into its line and
// the message "invalid YAML: msg"; the line is 0 when err names none.
func Split(err error) (int, string) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, after, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				return line, "invalid YAML: " + after
			}
		}
	}
	return 0, "invalid YAML: " + msg
}
