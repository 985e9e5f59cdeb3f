// Command xdsserver is an xDS management server built as Envoy Gateway's
// rate limit server is (go-control-plane's SotW server over its snapshot
// cache), for deploy/image's tests: it serves gRPC on -addr, with mutual
// TLS when -cert, -key and -ca are given, and takes snapshots on -control:
//
//	POST /snapshot?node=N&version=V   body: a JSON list of RateLimitConfig (protojson)
//	GET  /answers                     the answers of the nodes, a JSON line each: {"version", "error"}
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"sync"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/encoding/protojson"
)

func main() {
	addr := flag.String("addr", ":18001", "gRPC address")
	control := flag.String("control", ":8080", "HTTP address of /snapshot and /answers")
	certFile, keyFile, caFile := flag.String("cert", "", "server certificate"), flag.String("key", "", "its key"), flag.String("ca", "", "client CA")
	flag.Parse()

	var mu sync.Mutex
	var answers []byte
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		if r.GetResponseNonce() == "" {
			return nil
		}
		b, _ := json.Marshal(map[string]string{"version": r.GetVersionInfo(), "error": r.GetErrorDetail().GetMessage()})
		mu.Lock()
		answers = append(append(answers, b...), '\n')
		mu.Unlock()
		return nil
	}}
	var opts []grpc.ServerOption
	if *certFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			log.Fatal(err)
		}
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			log.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		opts = append(opts, grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})))
	}
	gs := grpc.NewServer(opts...)
	discovery.RegisterAggregatedDiscoveryServiceServer(gs, serverv3.NewServer(context.Background(), cache, cb))
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	go func() { log.Fatal(gs.Serve(lis)) }()

	http.HandleFunc("POST /snapshot", func(w http.ResponseWriter, r *http.Request) {
		var raw []json.RawMessage
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err == nil {
			err = json.Unmarshal(body, &raw)
		}
		res := make([]types.Resource, 0, len(raw))
		for _, m := range raw {
			rc := &rlconf.RateLimitConfig{}
			if err == nil {
				err = protojson.Unmarshal(m, rc)
			}
			res = append(res, rc)
		}
		var snap *cachev3.Snapshot
		if err == nil {
			snap, err = cachev3.NewSnapshot(r.URL.Query().Get("version"), map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
		}
		if err == nil {
			err = cache.SetSnapshot(r.Context(), r.URL.Query().Get("node"), snap)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	http.HandleFunc("GET /answers", func(w http.ResponseWriter, _ *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Write(answers) //nolint:errcheck // the test reads it again
	})
	log.Fatal(http.ListenAndServe(*control, nil))
}
