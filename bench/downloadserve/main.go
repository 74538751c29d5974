// Command downloadserve serves a directory on a loopback address for bench/download.sh:
// http.FileServer (ranges, ETag-less, Last-Modified), plus GET /_stats with the body bytes
// sent so far, so the benchmark can measure what a resume fetched again.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync/atomic"
)

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

func main() {
	dir := flag.String("dir", ".", "directory to serve")
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	portFile := flag.String("port-file", "", "write the chosen port here")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); !net.ParseIP(host).IsLoopback() {
		log.Fatalf("refusing to serve on non-loopback %s", host)
	}
	if *portFile != "" {
		os.WriteFile(*portFile, fmt.Appendf(nil, "%d\n", ln.Addr().(*net.TCPAddr).Port), 0o644)
	}
	var sent atomic.Int64
	fs := http.FileServer(http.Dir(*dir))
	log.Fatal(http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/_stats" {
			fmt.Fprintf(w, "%d\n", sent.Load())
			return
		}
		fs.ServeHTTP(countingWriter{w, &sent}, r)
	})))
}
