// Command downloadserve serves a directory on a loopback address for bench/download.sh:
// http.FileServer (ranges, ETag-less, Last-Modified), plus GET /_stats with the body bytes
// sent so far, so the benchmark can measure what a resume fetched again. -rate throttles
// each response (bench/repair.sh: a download in flight while a server is repaired).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

type countingWriter struct {
	http.ResponseWriter
	n    *atomic.Int64
	rate int64 // bytes per second; 0: as fast as it goes
}

func (c countingWriter) Write(p []byte) (int, error) {
	if c.rate <= 0 {
		n, err := c.ResponseWriter.Write(p)
		c.n.Add(int64(n))
		return n, err
	}
	const chunk = 32 << 10
	total := 0
	for len(p) > 0 {
		k := min(len(p), chunk)
		n, err := c.ResponseWriter.Write(p[:k])
		c.n.Add(int64(n))
		total += n
		if err != nil {
			return total, err
		}
		p = p[k:]
		time.Sleep(time.Duration(int64(time.Second) * chunk / c.rate))
	}
	return total, nil
}

func main() {
	dir := flag.String("dir", ".", "directory to serve")
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	portFile := flag.String("port-file", "", "write the chosen port here")
	rate := flag.Int64("rate", 0, "bytes per second per response (0: unthrottled)")
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
		fs.ServeHTTP(countingWriter{w, &sent, *rate}, r)
	})))
}
