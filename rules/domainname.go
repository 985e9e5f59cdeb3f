package rules

import "fmt"

// MaxDomainBytes caps the length of a domain's name: 128 bytes.
const MaxDomainBytes = 128

// CheckDomain returns an error unless name is a domain's name as sluice
// accepts it: 1 to MaxDomainBytes ASCII letters, digits, '_', '-' and
// '.', the first a letter, a digit or '_'. It is the one grammar of
// domain names in rules files, the rules database and the admin API, so
// that a name is always one element of a file path: never "." or "..",
// never a separator, never a hidden file, never a flag.
func CheckDomain(name string) error {
	if name == "" {
		return fmt.Errorf("domain: must not be empty")
	}
	if len(name) > MaxDomainBytes {
		return fmt.Errorf("domain: %d bytes; want at most %d", len(name), MaxDomainBytes)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' ||
			i > 0 && (c == '-' || c == '.')
		if !ok {
			return fmt.Errorf("domain %q: byte %d (%q) is not allowed; a domain is ASCII letters, digits, '_', '-' and '.', starting with a letter, a digit or '_'", name, i+1, name[i:i+1])
		}
	}
	return nil
}
