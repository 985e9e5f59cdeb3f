package server

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/control/xds"
	"github.com/sluicehq/sluice/rules"
)

// xdsScheme starts a rules source that is an xDS management server:
// --rules xds://HOST:PORT.
const xdsScheme = "xds://"

// SourceXDS is the source of a reload from an xDS management server, as
// the metrics name it.
const SourceXDS = "xds"

// XDSConfig is how rules come from an xDS management server (--rules
// xds://HOST:PORT), as Envoy Gateway serves them to its rate limit
// Deployment (control/xds). The defaults are Envoy ratelimit's.
type XDSConfig struct {
	// Node is the node id sent (--rules-xds-node). Default
	// xds.DefaultNode, "default".
	Node string
	// Metadata is the node's metadata (--rules-xds-node-metadata,
	// key=value,...). Default: none.
	Metadata map[string]string
	// Headers are gRPC metadata sent on the stream (--rules-xds-headers,
	// key=value,...). Default: none.
	Headers map[string]string
	// TLS dials the server with TLS (--rules-xds-tls); CA signs its
	// certificate (--rules-xds-ca; default: the system's), Cert and Key are
	// a client certificate for mutual TLS (--rules-xds-cert,
	// --rules-xds-key), ServerName the name its certificate must carry
	// (--rules-xds-server-name; default: the host of the address). The
	// files are read again at each connection.
	TLS                       bool
	CA, Cert, Key, ServerName string
	// RetryInitial is the first wait before subscribing again after the
	// stream failed, doubled at each failure in a row up to RetryMax
	// (--rules-xds-retry, --rules-xds-retry-max), each wait RetryJitter of
	// it at random either way (--rules-xds-retry-jitter; negative: none).
	// Defaults 3s, 60s and 0.5.
	RetryInitial, RetryMax time.Duration
	RetryJitter            float64
	// MaxMessageBytes is the largest response read
	// (--rules-xds-max-message-size). Default 4 MiB.
	MaxMessageBytes int
	// StartWithoutRules makes the server ready before the first rules
	// came, deciding without limits until they do
	// (--rules-xds-start-without-rules; Envoy's
	// FORCE_START_WITHOUT_INITIAL_CONFIG). Default false: not ready
	// (/readyz 503) until they came.
	StartWithoutRules bool
}

// defaultXDS is XDSConfig's defaults, Envoy ratelimit's.
func defaultXDS() XDSConfig {
	return XDSConfig{
		Node:            xds.DefaultNode,            // Envoy's CONFIG_GRPC_XDS_NODE_ID default
		RetryInitial:    xds.DefaultRetryInitial,    // 3s, Envoy's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL
		RetryMax:        xds.DefaultRetryMax,        // 60s, Envoy's XDS_CLIENT_BACKOFF_MAX_INTERVAL
		RetryJitter:     xds.DefaultRetryJitter,     // 0.5, Envoy's XDS_CLIENT_BACKOFF_RANDOM_FACTOR
		MaxMessageBytes: xds.DefaultMaxMessageBytes, // 4 MiB, gRPC's
	}
}

// isXDS reports whether a rules source names an xDS management server.
func isXDS(spec string) bool { return strings.HasPrefix(strings.ToLower(spec), xdsScheme) }

// openRulesXDS subscribes to the xDS management server rc.Source names.
// Each response is counted and shown as a reload from SourceXDS; the
// Subscription logs what it did with it.
func openRulesXDS(log *slog.Logger, rc RulesConfig, check func(sluice.Limit) error, h rulesHooks) (*xds.Subscription, error) {
	addr := rc.Source[len(xdsScheme):]
	if addr == "" || strings.ContainsAny(addr, "/?#") {
		return nil, configError("--rules %s: want xds://HOST:PORT", rc.Source)
	}
	x := rc.XDS
	c := xds.Config{
		Server: addr, Node: x.Node, Metadata: x.Metadata, Headers: x.Headers,
		RetryInitial: x.RetryInitial, RetryMax: x.RetryMax, RetryJitter: x.RetryJitter, MaxMessageBytes: x.MaxMessageBytes,
		Loader: rc.Loader(), Check: check, Logger: log,
		OnUpdate: func(set *rules.Set, _ string, err error) {
			h.m.Reload(err)
			h.rm.Reload(set, SourceXDS, 0, err)
			h.onReload(set, err)
		},
	}
	if x.TLS {
		c.TLS = &xds.TLSFiles{Cert: x.Cert, Key: x.Key, CA: x.CA, ServerName: x.ServerName}
	} else if x.Cert != "" || x.Key != "" || x.CA != "" {
		return nil, configError("--rules-xds-cert, --rules-xds-key and --rules-xds-ca need --rules-xds-tls")
	}
	sub, err := xds.Subscribe(c)
	if err != nil {
		return nil, configError("--rules %s: %v", rc.Source, err)
	}
	what := "not ready until they come (--rules-xds-start-without-rules serves without them)"
	if x.StartWithoutRules {
		what = "every request passes unlimited until they come"
	}
	log.Info("rules from an xDS management server: "+what, "rules", rc.Source, "node", c.Node)
	return sub, nil
}

// xdsReady returns the readiness of rules from sub: an error until the
// first rules came, unless the server starts without them.
func xdsReady(sub *xds.Subscription, startWithout bool) func() error {
	if startWithout {
		return func() error { return nil }
	}
	return func() error {
		select {
		case <-sub.Ready():
			return nil
		default:
			st := sub.State()
			why := "not connected"
			if st.Connected {
				why = "connected; no rules for node " + st.Node + " yet: is it the node id the server serves?"
			}
			if st.Error != "" {
				why += "; refused version " + st.Refused + ": " + st.Error
			}
			return fmt.Errorf("no rules from the xDS server %s yet (%s)", st.Server, why)
		}
	}
}
