package main

import (
	"reflect"
	"testing"

	"github.com/sluicehq/sluice/store/stack"
)

// TestRegionFlags maps --region and --peer-region, repeated, from flags,
// the environment and a config file, onto server.Config's store; a flag's
// peers are not added to by the file's.
func TestRegionFlags(t *testing.T) {
	t.Parallel()
	us, ap := stack.Peer{Name: "us", URL: "redis://u:1"}, stack.Peer{Name: "ap", URL: "redis+cluster://a:1,b:2"}
	ap2 := stack.Peer{Name: "ap", URL: "redis://a:2"}
	list := writeTemp(t, "sluice.yaml", "region: eu\npeer-region: [us=redis://u:1, ap=redis://a:2]\n")
	scalar := writeTemp(t, "sluice.yaml", "region: eu\npeer-region: us=redis://u:1,ap=redis+cluster://a:1,b:2\n")
	flagFile := writeTemp(t, "sluice.yaml", "peer-region: [us=redis://file:1]\n")
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want []stack.Peer
	}{
		{"flags", []string{"--region", "eu", "--peer-region", "us=redis://u:1", "--peer-region", "ap=redis+cluster://a:1,b:2"}, nil, []stack.Peer{us, ap}},
		{"one flag, a list", []string{"--region", "eu", "--peer-region", "us=redis://u:1,ap=redis+cluster://a:1,b:2"}, nil, []stack.Peer{us, ap}},
		{"the environment", nil, []string{"SLUICE_REGION=eu", "SLUICE_PEER_REGION=us=redis://u:1,ap=redis+cluster://a:1,b:2"}, []stack.Peer{us, ap}},
		{"a config file's list", []string{"--config", list}, nil, []stack.Peer{us, ap2}},
		{"a config file's string (a URL with commas)", []string{"--config", scalar}, nil, []stack.Peer{us, ap}},
		{"a flag over a config file", []string{"--config", flagFile, "--region", "eu", "--peer-region", "us=redis://u:1"}, nil, []stack.Peer{us}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := settingsOf(t, "serve", env(tc.env...), tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			if s.cfg.Store.Region != "eu" || !reflect.DeepEqual(s.cfg.Store.Peers, tc.want) {
				t.Errorf("region %q, peers %+v; want eu, %+v", s.cfg.Store.Region, s.cfg.Store.Peers, tc.want)
			}
		})
	}
	if _, err := settingsOf(t, "serve", env(), "--peer-region", "redis://u:1"); err == nil {
		t.Error("--peer-region without a name accepted")
	}
}
