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

// MaxEnvoyDomainBytes caps the length of a domain's name that
// CheckEnvoyDomain accepts: 512 bytes, room for Envoy Gateway's
// namespace/gateway/listener.
const MaxEnvoyDomainBytes = 512

// CheckEnvoyDomain returns an error unless name is a domain's name as
// Envoy's ratelimit takes it from xDS: 1 to MaxEnvoyDomainBytes printable
// ASCII bytes, no space. Envoy Gateway names its domains after its
// listeners, "namespace/gateway/listener", which CheckDomain refuses: such
// names are never file names.
func CheckEnvoyDomain(name string) error {
	if name == "" {
		return fmt.Errorf("domain: must not be empty")
	}
	if len(name) > MaxEnvoyDomainBytes {
		return fmt.Errorf("domain: %d bytes; want at most %d", len(name), MaxEnvoyDomainBytes)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("domain %q: byte %d (%q) is not allowed; a domain is printable ASCII without spaces", name, i+1, name[i:i+1])
		}
	}
	return nil
}
