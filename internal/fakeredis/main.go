// Command fakeredis is a hostile peer region's "Redis" for the container
// tests of deploy/image (TestRegionsHostilePeerContainer): testenv's
// FakeRedis, which answers a client's greeting (HELLO, CLIENT, SCRIPT LOAD,
// PING) as Redis would and every other command with testenv's hostile
// answer named by --answer: header (a RESP array header of 2^31−1
// elements, the reply that once made a server die out of memory), board
// (a board of 1,000 records of 60 KB) or clock (a malformed clock). It
// serves until it is stopped (SIGINT, SIGTERM).
//
//	CGO_ENABLED=0 go build ./internal/fakeredis && ./fakeredis --addr :6379 --answer board
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

func main() {
	addr := flag.String("addr", ":6379", "where to listen")
	name := flag.String("answer", "header", "the hostile answer: header, board or clock")
	flag.Parse()
	answer := testenv.HostileAnswer(*name)
	if answer == nil {
		fmt.Fprintf(os.Stderr, "fakeredis: no answer %q: header, board or clock\n", *name)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f := testenv.ServeFakeRedis(ln, answer)
	fmt.Printf("fakeredis: listening on %s, answering %s\n", f.Addr, *name)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
	f.Close()
}
