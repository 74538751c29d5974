// Command downloadserve serves a directory on a loopback address for bench/download.sh:
// http.FileServer (ranges, ETag-less, Last-Modified), plus GET /_stats with the body bytes
// sent so far and GET /_maxconns with the most responses in flight at once, so the
// benchmark can measure what a resume fetched again and how many connections a client
// used; GET /_reset forgets the connections seen (for -congested).
//
// With -rate and -delay it emulates a model CDN: each response (one per connection at a
// time) is paced at -rate bytes per second after a -delay before its first byte, as CDNs
// cap each connection and answer after a round trip to their origin. With -congested N the
// first N connections (in the order of their first request) are paced at -congested-rate
// instead: one CDN edge congested. -refuse-head answers HEAD with 405, as some object
// stores do.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

type stats struct {
	sent              atomic.Int64
	inFlight, maxSeen atomic.Int64
}

// pacedWriter counts body bytes and, with a rate, sends them no faster than it.
type pacedWriter struct {
	http.ResponseWriter
	st    *stats
	rate  int64
	start time.Time
	n     int64
}

func (p *pacedWriter) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		chunk := b
		if p.rate > 0 {
			chunk = b[:min(len(b), int(max(p.rate/100, 4096)))]
			due := p.start.Add(time.Duration(float64(p.n) / float64(p.rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		k, err := p.ResponseWriter.Write(chunk)
		written += k
		p.n += int64(k)
		p.st.sent.Add(int64(k))
		if err != nil {
			return written, err
		}
		b = b[k:]
	}
	return written, nil
}

func main() {
	dir := flag.String("dir", ".", "directory to serve")
	addr := flag.String("addr", "127.0.0.1:0", "loopback address to listen on")
	portFile := flag.String("port-file", "", "write the chosen port here")
	rate := flag.Int64("rate", 0, "cap each response at this many bytes per second (0: none)")
	delay := flag.Duration("delay", 0, "wait this long before each response's first byte")
	logResponses := flag.Bool("log", false, "log each response (method, path, range, body bytes) to stderr")
	congested := flag.Int("congested", 0, "pace the first N connections at -congested-rate instead of -rate")
	congestedRate := flag.Int64("congested-rate", 1<<20, "bytes per second of a congested connection")
	refuseHead := flag.Bool("refuse-head", false, "answer HEAD with 405 Method Not Allowed")
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
	var st stats
	fs := http.FileServer(http.Dir(*dir))
	var connMu sync.Mutex
	conns := map[string]int{} // client address -> order of its first request
	log.Fatal(http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/_stats":
			fmt.Fprintf(w, "%d\n", st.sent.Load())
			return
		case "/_maxconns":
			fmt.Fprintf(w, "%d\n", st.maxSeen.Load())
			return
		case "/_reset":
			// The next client's first connections are the congested ones again.
			connMu.Lock()
			clear(conns)
			connMu.Unlock()
			return
		}
		if *refuseHead && r.Method == http.MethodHead {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		connMu.Lock()
		order, ok := conns[r.RemoteAddr]
		if !ok {
			order = len(conns)
			conns[r.RemoteAddr] = order
		}
		connMu.Unlock()
		pace := *rate
		if order < *congested {
			pace = *congestedRate
		}
		n := st.inFlight.Add(1)
		defer st.inFlight.Add(-1)
		for {
			m := st.maxSeen.Load()
			if n <= m || st.maxSeen.CompareAndSwap(m, n) {
				break
			}
		}
		if *delay > 0 {
			time.Sleep(*delay)
		}
		pw := &pacedWriter{ResponseWriter: w, st: &st, rate: pace, start: time.Now()}
		fs.ServeHTTP(pw, r)
		if *logResponses {
			// What the quickstart's test adds up: every body byte this server sent.
			log.Printf("%s %s range=%q bytes=%d", r.Method, r.URL.Path, r.Header.Get("Range"), pw.n)
		}
	})))
}
