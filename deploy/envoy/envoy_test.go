// Package envoy holds the Envoy quickstart (envoy.yaml and compose.yaml)
// and the test that decodes envoy.yaml strictly into Envoy's Bootstrap and
// validates it, every typed config included, as Envoy does when it starts.
package envoy

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3" // typed configs envoy.yaml names
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protopath"
	"google.golang.org/protobuf/reflect/protorange"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	kyaml "sigs.k8s.io/yaml"
)

// loadBootstrap decodes the Envoy config at path strictly: an unknown
// field, or an Any whose type is not linked in, is an error.
func loadBootstrap(path string) (*bootstrapv3.Bootstrap, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	js, err := kyaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &b, nil
}

// validateAll runs the protoc-gen-validate rules of m and of every message
// packed in an Any (typed_config) inside it, which m's own ValidateAll does
// not open: protorange walks into each Any, however deep, and each is
// validated once.
func validateAll(m proto.Message) error {
	var errs []error
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, err)
		}
	}
	err := protorange.Range(m.ProtoReflect(), func(p protopath.Values) error {
		last := p.Index(-1)
		msg, ok := last.Value.Interface().(protoreflect.Message)
		if !ok {
			return nil
		}
		a, ok := msg.Interface().(*anypb.Any)
		if !ok {
			return nil
		}
		inner, err := a.UnmarshalNew()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p.Path[1:], err))
			return nil
		}
		v, ok := inner.(interface{ ValidateAll() error })
		if !ok {
			return nil
		}
		if err := v.ValidateAll(); err != nil {
			errs = append(errs, fmt.Errorf("%s (%s): %w", p.Path[1:], a.GetTypeUrl(), err))
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// TestEnvoyConfig decodes envoy.yaml, validates it, and checks that its
// names agree: the clusters the routes and the rate limit filter name
// exist, the filter asks sluice in a domain the example rules define, and
// the sluice cluster points at sluice's gRPC port in the compose file.
func TestEnvoyConfig(t *testing.T) {
	t.Parallel()
	b, err := loadBootstrap("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := validateAll(b); err != nil {
		t.Fatalf("envoy.yaml: %v", err)
	}

	clusters := map[string]string{} // name: first endpoint, host:port
	for _, c := range b.GetStaticResources().GetClusters() {
		ep := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		clusters[c.GetName()] = ep.GetAddress() + ":" + strconv.Itoa(int(ep.GetPortValue()))
	}
	// The domains of the example rules compose.yaml mounts (sluice's own
	// tests check that they load).
	domains, err := ruleDomains("../../examples/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rateLimited := 0
	for _, l := range b.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					t.Fatalf("listener %s: %v", l.GetName(), err)
				}
				actions := 0
				for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
					for _, r := range vh.GetRoutes() {
						if ra, ok := r.GetAction().(*routev3.Route_Route); ok {
							if _, ok := clusters[ra.Route.GetCluster()]; !ok {
								t.Errorf("listener %s: a route names cluster %q, which is not defined", l.GetName(), ra.Route.GetCluster())
							}
							actions += len(ra.Route.GetRateLimits())
						}
					}
				}
				filters := hcm.GetHttpFilters()
				if n := len(filters); n == 0 || filters[n-1].GetName() != "envoy.filters.http.router" {
					t.Errorf("listener %s: the router is not the last HTTP filter", l.GetName())
				}
				for _, hf := range filters {
					var rl ratelimitv3.RateLimit
					if hf.GetTypedConfig().UnmarshalTo(&rl) != nil {
						continue
					}
					rateLimited++
					if actions == 0 {
						t.Errorf("listener %s: a rate limit filter but no route with rate_limits actions", l.GetName())
					}
					name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
					addr, ok := clusters[name]
					if !ok {
						t.Errorf("listener %s: rate_limit_service names cluster %q, which is not defined", l.GetName(), name)
					}
					if addr != "sluice:8081" {
						t.Errorf("rate_limit_service cluster %s points at %s, want sluice:8081 (the compose service, sluice's gRPC port)", name, addr)
					}
					if !slices.Contains(domains, rl.GetDomain()) {
						t.Errorf("the rate limit filter asks in domain %q, which examples/rules.yaml does not define (%v)", rl.GetDomain(), domains)
					}
				}
			}
		}
	}
	if rateLimited != 1 {
		t.Errorf("%d rate limit filters, want 1", rateLimited)
	}
}

// TestEnvoyConfigRefusals checks that loadBootstrap and validateAll catch
// what Envoy would refuse: a misspelt field, a typed config of an unknown
// type, and a value out of range, also inside a typed config.
func TestEnvoyConfigRefusals(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, old, new string }{
		{"misspelt field", "connect_timeout: 1s", "connect_timeout_ms: 1s"},
		{"unknown typed config", "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router", "type.googleapis.com/envoy.extensions.filters.http.nope.v3.Nope"},
		{"port out of range", "port_value: 9901", "port_value: 99010"},
		{"invalid inside a typed config", "domain: api", "domain: \"\""},
		{"bad enum inside a typed config", "transport_api_version: V3", "transport_api_version: V4"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !strings.Contains(string(good), tt.old) {
				t.Fatalf("envoy.yaml has no %q to change", tt.old)
			}
			path := filepath.Join(t.TempDir(), "envoy.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(string(good), tt.old, tt.new, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			b, err := loadBootstrap(path)
			if err == nil {
				err = validateAll(b)
			}
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
		})
	}
}

// TestCompose checks compose.yaml against envoy.yaml: the files it mounts
// exist, Envoy gets envoy.yaml, and sluice and Redis are the services
// envoy.yaml and sluice's store URL name.
func TestCompose(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Volumes     []string          `yaml:"volumes"`
			Ports       []string          `yaml:"ports"`
			DependsOn   []string          `yaml:"depends_on"`
			MemLimit    string            `yaml:"mem_limit"`
			Build       struct {
				Context    string `yaml:"context"`
				Dockerfile string `yaml:"dockerfile"`
			} `yaml:"build"`
		} `yaml:"services"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for _, name := range []string{"sluice", "redis", "envoy"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("compose.yaml has no service %s", name)
		}
	}
	for name, s := range c.Services {
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if _, err := os.Stat(src); err != nil {
				t.Errorf("service %s mounts %s: %v", name, src, err)
			}
		}
		for _, d := range s.DependsOn {
			if _, ok := c.Services[d]; !ok {
				t.Errorf("service %s depends on %s, which is not a service", name, d)
			}
		}
	}
	sl := c.Services["sluice"]
	if _, err := os.Stat(filepath.Join(sl.Build.Context, sl.Build.Dockerfile)); err != nil {
		t.Errorf("sluice's build: %v", err)
	}
	if got := sl.Environment["SLUICE_STORE"]; got != "redis://redis:6379/0" {
		t.Errorf("sluice's store is %q, want the redis service", got)
	}
	if !strings.Contains(strings.Join(c.Services["envoy"].Volumes, " "), "./envoy.yaml:") {
		t.Errorf("envoy does not mount envoy.yaml: %v", c.Services["envoy"].Volumes)
	}
}

// ruleDomains returns the domain of each YAML document of the rules file
// at path.
func ruleDomains(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var domains []string
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	for {
		var doc struct {
			Domain string `yaml:"domain"`
		}
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return domains, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		domains = append(domains, doc.Domain)
	}
}
