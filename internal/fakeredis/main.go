// Command fakeredis is a hostile peer region's "Redis" for the container
// tests of deploy/image (TestRegionsHostilePeerContainer): testenv's
// FakeRedis, which answers a client's greeting (HELLO, CLIENT, SCRIPT LOAD,
// PING) as Redis would and every other command with a RESP array header of
// 2^31−1 elements, the reply that once made a server die out of memory.
// It serves until it is stopped (SIGINT, SIGTERM).
//
//	CGO_ENABLED=0 go build ./internal/fakeredis && ./fakeredis --addr :6379
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/testenv"
)

// headerBomb is the answer to every command: an array that announces
// 2^31−1 elements and sends none.
var headerBomb = []byte("*2147483647\r\n")

func main() {
	addr := flag.String("addr", ":6379", "where to listen")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f := testenv.ServeFakeRedis(ln, func([]string) []byte { return headerBomb })
	fmt.Printf("fakeredis: listening on %s\n", f.Addr)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	f.Close()
}
