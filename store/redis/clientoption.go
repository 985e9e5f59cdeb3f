package redis

import "github.com/redis/rueidis"

// ClientOption returns the rueidis options a store URL makes (see Open for
// the URLs), for other clients of the same Redis, such as the rules
// database, to read URLs exactly as the store does.
func ClientOption(rawURL string, cfg Config) (rueidis.ClientOption, error) {
	opt, _, err := parseURL(rawURL, cfg.withDefaults())
	return opt, err
}
