package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// Roles of a re-executed child, in FAKE_SGLANG_ROLE.
const (
	roleEnv         = "FAKE_SGLANG_ROLE"
	roleChild       = "child"
	roleSetsidChild = "setsid-child"
	rolePortHolder  = "port-holder"
)

func run(argv []string) int {
	f, ferr := parseFaults(os.Getenv("FAKE_SGLANG"))
	switch os.Getenv(roleEnv) {
	case roleChild, roleSetsidChild, rolePortHolder:
		return runChild(f)
	}
	if ferr != nil {
		fmt.Fprintf(os.Stderr, "fake-sglang: %v\n", ferr)
		return 1
	}
	ent, argv := entryOf(append([]string{os.Args[0]}, argv...))
	a, err := parseArgs(argv)
	var ae *argError
	switch {
	case err == errHelp:
		fmt.Fprint(os.Stdout, help(ent.prog()))
		return 0
	case errors.As(err, &ae):
		fmt.Fprint(os.Stderr, usage(ent.prog()))
		fmt.Fprintf(os.Stderr, "%s: error: %s\n", ent.prog(), ae.msg)
		return 2
	case err != nil:
		fmt.Fprintf(os.Stderr, "fake-sglang: %v\n", err)
		return 1
	}
	interval := time.Second
	if v := os.Getenv("FAKE_SGLANG_DECODE_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fmt.Fprintf(os.Stderr, "fake-sglang: FAKE_SGLANG_DECODE_INTERVAL: %v\n", err)
			return 1
		}
		interval = d
	}
	s := &server{args: a, faults: f, log: &logger{w: os.Stderr}, decodeInterval: interval, exit: make(chan int, 1)}
	return s.run()
}

// runChild is a re-executed child: it holds what it inherited (the
// listening socket for the port holder) and sleeps until a signal ends it.
func runChild(f faults) int {
	sigs := make(chan os.Signal, 1)
	if f.ignoreSIGTERM {
		signal.Ignore(syscall.SIGTERM)
		signal.Notify(sigs, syscall.SIGINT)
	} else {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	}
	<-sigs
	return 0
}

// logger writes SGLang-style lines; safe for concurrent use.
type logger struct {
	mu sync.Mutex
	w  io.Writer
}

func stamp() string { return time.Now().Format("2006-01-02 15:04:05") }

// main logs from the HTTP/tokenizer process: "[ts] msg".
func (l *logger) main(format string, v ...any) {
	l.raw("[" + stamp() + "] " + fmt.Sprintf(format, v...))
}

// rank logs from a scheduler: "[ts TP0] msg".
func (l *logger) rank(tp int, format string, v ...any) {
	l.raw("[" + stamp() + " TP" + strconv.Itoa(tp) + "] " + fmt.Sprintf(format, v...))
}

// dpRank logs from the scheduler of one DP-attention rank: "[ts DP1 TP1] msg"
// (SGLang's configure_scheduler prefix; the rank's first TP rank).
func (l *logger) dpRank(dp, tp int, format string, v ...any) {
	l.raw("[" + stamp() + " DP" + strconv.Itoa(dp) + " TP" + strconv.Itoa(tp) + "] " + fmt.Sprintf(format, v...))
}

// raw writes lines as they are (tracebacks, tqdm bars).
func (l *logger) raw(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	io.WriteString(l.w, strings.TrimRight(s, "\n")+"\n")
}

type server struct {
	args           args
	faults         faults
	log            *logger
	decodeInterval time.Duration
	exit           chan int

	mu       sync.Mutex
	ready    bool
	children []*exec.Cmd
	ln       net.Listener
	stats    stats
	wedged   bool      // the engine hangs (engine.go)
	wedgedAt time.Time // when it did: the last output of the engine
	hung     int       // requests hanging on the wedged engine
}

// stats is what /metrics and the decode lines report.
type stats struct {
	tokens           int
	decodeTicks      int
	promptTokens     int
	generationTokens int
	requests         int
}

func (s *server) tpSize() int {
	if n := s.args.int("tp-size"); n > 0 && n <= 64 {
		return n
	}
	return 1
}

func (s *server) run() int {
	sigs := make(chan os.Signal, 1)
	if s.faults.ignoreSIGTERM {
		signal.Ignore(syscall.SIGTERM)
		signal.Notify(sigs, syscall.SIGINT)
	} else {
		signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	go func() {
		for range usr1 {
			s.wedgeNow()
		}
	}()
	go s.start()
	select {
	case <-sigs:
		s.killChildren()
		return 0
	case code := <-s.exit:
		s.killChildren()
		return code
	}
}

// fail ends the launch with code, as SGLang's launcher does when a child dies.
func (s *server) fail(code int) {
	select {
	case s.exit <- code:
	default:
	}
	select {} // run() exits the process
}

func (s *server) killChildren() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.children {
		if c.Process != nil {
			_ = c.Process.Signal(syscall.SIGKILL)
		}
	}
	if s.ln != nil {
		_ = s.ln.Close()
	}
}

const sitePackages = "/usr/local/lib/python3.12/dist-packages"

func (s *server) start() {
	a := s.args
	s.log.main("%s", serverArgsLine(a))
	if s.faults.exitOnStart {
		time.Sleep(100 * time.Millisecond)
		s.log.raw(noGPUTraceback)
		s.fail(1)
	}
	if mp := a.str("model-path"); isLocalPath(mp) {
		if st, err := os.Stat(mp); err != nil || !st.IsDir() {
			s.log.raw(modelPathTraceback(mp))
			s.fail(1)
		}
	}
	addr := net.JoinHostPort(a.str("host"), a.str("port"))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		s.log.main("ERROR:    [Errno 98] error while attempting to bind on address ('%s', %s): address already in use", a.str("host"), a.str("port"))
		s.fail(1)
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	go s.serveHTTP(ln)
	if err := s.startChildren(ln); err != nil {
		s.log.main("fake-sglang: start children: %v", err)
		s.fail(1)
	}

	s.startUp(addr)

	if s.faults.crashAfter > 0 {
		go func() {
			time.Sleep(s.faults.crashAfter)
			s.log.rank(0, "Scheduler hit an exception: %s", crashTraceback)
			s.log.main("Received sigquit from a child process. It usually means the child failed.")
			s.fail(1)
		}()
	}
	if s.faults.wedge {
		go func() {
			time.Sleep(s.faults.wedgeAfter)
			s.wedgeNow()
		}()
	}
	if s.decodeInterval > 0 {
		t := time.NewTicker(s.decodeInterval)
		for range t.C {
			if !s.isWedged() {
				s.decodeLine(40)
			}
		}
	}
}

// startUp logs what SGLang logs from its ranks' start to "ready to roll", with the
// faults that end it early, and marks the server ready.
func (s *server) startUp(addr string) {
	tp := s.tpSize()
	avail := s.loadWeights(tp)
	s.allocate(tp, avail, addr)
}

// loadWeights logs the ranks' start and their weights' load; avail is the memory left.
func (s *server) loadWeights(tp int) (avail float64) {
	a := s.args
	for r := 0; r < tp; r++ {
		s.log.rank(r, "Init torch distributed begin.")
	}
	for r := 0; r < tp; r++ {
		s.log.rank(r, "Init torch distributed ends. mem usage=0.35 GB")
	}
	const availBegin = 46.92
	for r := 0; r < tp; r++ {
		s.log.rank(r, "Load weight begin. avail mem=%.2f GB", availBegin)
	}
	shards, size := safetensors(a.str("model-path"))
	if s.faults.slowStart > 0 {
		time.Sleep(s.faults.slowStart)
	}
	if s.faults.load {
		if err := s.loadCheckpoint(a.str("model-path"), a.str("speculative-draft-model-path")); err != nil {
			s.log.rank(0, "Scheduler hit an exception: %s", loadTraceback(err))
			s.log.main("Received sigquit from a child process. It usually means the child failed.")
			s.fail(1)
		}
	} else if shards > 0 {
		s.log.raw(fmt.Sprintf("Loading safetensors checkpoint shards: 100%% Completed | %d/%d [00:00<00:00, 42.00it/s]\n", shards, shards))
	}
	usage := 25.91
	if size > 0 {
		usage = float64(size) / 1e9 / float64(tp)
	}
	avail = availBegin - usage
	if avail < 0.5 {
		avail = 0.5
	}
	for r := 0; r < tp; r++ {
		s.log.rank(r, "Load weight end. type=%s, dtype=torch.bfloat16, avail mem=%.2f GB, mem usage=%.2f GB.", s.arch(), avail, usage)
	}
	return avail
}

// allocate logs the caches, the CUDA graphs and the start of serving, with the faults
// that fail them, and marks the server ready.
func (s *server) allocate(tp int, avail float64, addr string) {
	a := s.args
	switch s.faults.oom {
	case "cuda":
		s.log.rank(0, "Scheduler hit an exception: %s", cudaOOMTraceback)
		s.log.main("Received sigquit from a child process. It usually means the child failed.")
		s.fail(1)
	case "kv":
		s.log.rank(0, "Scheduler hit an exception: %s", kvOOMTraceback)
		s.log.main("Received sigquit from a child process. It usually means the child failed.")
		s.fail(1)
	}
	s.jitCaches()
	const kvTokens = 413696
	for r := 0; r < tp; r++ {
		if s.hybrid() {
			s.log.rank(r, "Mamba Cache is allocated. max_mamba_cache_size: 96, conv_state size: 0.21GB, ssm_state size: 2.88GB ")
		}
		s.log.rank(r, "KV Cache is allocated. #tokens: %d, K size: 3.16 GB, V size: 3.16 GB", kvTokens)
	}
	s.log.rank(0, "Memory pool end. avail mem=%.2f GB", avail*0.3)
	if !a.on("disable-cuda-graph") {
		s.log.rank(0, "Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB", avail*0.29)
		s.log.rank(0, "Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32, 40, 48]")
		if s.faults.cudaGraphFail {
			s.log.rank(0, "Scheduler hit an exception: %s", cudaGraphTraceback)
			s.log.main("Received sigquit from a child process. It usually means the child failed.")
			s.fail(1)
		}
		s.log.rank(0, "Capture cuda graph end. Time elapsed: 0.02 s. mem usage=0.31 GB. avail mem=%.2f GB.", avail*0.27)
	}
	maxRun := a.int("max-running-requests")
	if maxRun <= 0 {
		maxRun = 48
	}
	s.log.rank(0, "max_total_num_tokens=%d, chunked_prefill_size=8192, max_prefill_tokens=%s, max_running_requests=%d, context_len=262144, available_gpu_mem=%.2f GB", kvTokens, a.str("max-prefill-tokens"), maxRun, avail*0.27)
	s.log.main("INFO:     Started server process [%d]", os.Getpid())
	s.log.main("INFO:     Waiting for application startup.")
	s.log.main("INFO:     Application startup complete.")
	s.log.main("INFO:     Uvicorn running on http://%s (Press CTRL+C to quit)", addr)
	s.log.main(`INFO:     127.0.0.1:51000 - "GET /get_model_info HTTP/1.1" 200 OK`)
	s.log.rank(0, "Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, %s#running-req: 0, #queue-req: 0, ", s.usageMsg(false))
	s.log.main(`INFO:     127.0.0.1:51002 - "POST /generate HTTP/1.1" 200 OK`)
	s.mu.Lock()
	s.ready = true
	s.mu.Unlock()
	s.log.main("The server is fired up and ready to roll!")
}

func isLocalPath(p string) bool {
	return strings.HasPrefix(p, "/") || strings.HasPrefix(p, ".") || strings.HasPrefix(p, "~")
}

// safetensors counts the *.safetensors files in dir and their total size.
func safetensors(dir string) (n int, size int64) {
	m, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	for _, p := range m {
		if st, err := os.Stat(p); err == nil {
			n++
			size += st.Size()
		}
	}
	return n, size
}

func (s *server) hybrid() bool {
	return s.faults.hybrid || s.args.set["mamba-full-memory-ratio"]
}

func (s *server) arch() string {
	if s.hybrid() {
		return "Qwen3NextForCausalLM"
	}
	return "Qwen3ForCausalLM"
}

// usageMsg is the token-usage part of a batch line, as the scheduler
// formats it for plain and hybrid GDN models.
func (s *server) usageMsg(decode bool) string {
	s.mu.Lock()
	tok := s.stats.tokens
	s.mu.Unlock()
	u := float64(tok) / 413696
	switch {
	case s.hybrid() && decode:
		return fmt.Sprintf("#full token: %d, full token usage: %.2f, mamba num: 1, mamba usage: 0.06, ", tok, u)
	case s.hybrid():
		return fmt.Sprintf("full token usage: %.2f, mamba usage: 0.06, ", u)
	case decode:
		return fmt.Sprintf("#token: %d, token usage: %.2f, ", tok, u)
	}
	return fmt.Sprintf("token usage: %.2f, ", u)
}

// specNumbers returns the accept length and rate the fake reports; MTP on
// the field report's host accepted 97% of 4 draft tokens.
func (s *server) specNumbers() (acceptLen, acceptRate float64, ok bool) {
	if s.args.str("speculative-algorithm") == "" {
		return 0, 0, false
	}
	draft := s.args.int("speculative-num-draft-tokens")
	if draft <= 0 {
		draft = s.args.int("speculative-num-steps") + 1
	}
	if draft <= 1 {
		draft = 4
	}
	acceptLen = 0.97 * float64(draft)
	return acceptLen, acceptLen / float64(draft), true
}

func (s *server) genThroughput() float64 {
	s.mu.Lock()
	n := s.stats.decodeTicks
	s.mu.Unlock()
	return 60.47 + float64(n%5)*0.4
}

// decodeLine prints one "Decode batch, ..." line after newTokens were made.
func (s *server) decodeLine(newTokens int) {
	s.mu.Lock()
	s.stats.tokens += newTokens
	if s.stats.tokens > 400000 { // a long-running fake must not fill its pool
		s.stats.tokens = newTokens
	}
	s.stats.decodeTicks++
	s.mu.Unlock()
	msg := "Decode batch, #running-req: 1, " + s.usageMsg(true)
	if al, ar, ok := s.specNumbers(); ok {
		msg += fmt.Sprintf("accept len: %.2f, accept rate: %.2f, ", al, ar)
	}
	msg += fmt.Sprintf("cuda graph: %s, gen throughput (token/s): %.2f, #queue-req: 0, ", pyBool(!s.args.on("disable-cuda-graph")), s.genThroughput())
	if n := s.dpRanks(); n > 1 {
		// With DP attention every DP rank decodes its own batch and logs its
		// own line; the server's throughput is their sum.
		for dp := 0; dp < n; dp++ {
			s.log.dpRank(dp, dp*s.tpSize()/n, "%s", msg)
		}
		return
	}
	s.log.rank(0, "%s", msg)
}

// dpRanks is the number of DP-attention ranks (--enable-dp-attention with
// --dp-size), 1 without DP attention.
func (s *server) dpRanks() int {
	if n := s.args.int("dp-size"); s.args.on("enable-dp-attention") && n > 1 && n <= s.tpSize() {
		return n
	}
	return 1
}

func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

// startChildren starts the child processes FAKE_SGLANG asks for.
func (s *server) startChildren(ln net.Listener) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	start := func(role string, attr *syscall.SysProcAttr, extra []*os.File) error {
		c := exec.Command(exe, os.Args[1:]...)
		c.Env = append(os.Environ(), roleEnv+"="+role)
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		c.SysProcAttr = attr
		c.ExtraFiles = extra
		if err := c.Start(); err != nil {
			return fmt.Errorf("start %s: %w", role, err)
		}
		s.mu.Lock()
		s.children = append(s.children, c)
		s.mu.Unlock()
		go c.Wait() // reap while we live
		return nil
	}
	for i := 0; i < s.faults.children; i++ {
		if err := start(roleChild, nil, nil); err != nil {
			return err
		}
	}
	if s.faults.setsidChild {
		if err := start(roleSetsidChild, &syscall.SysProcAttr{Setsid: true}, nil); err != nil {
			return err
		}
	}
	if s.faults.holdPort {
		tl, ok := ln.(*net.TCPListener)
		if !ok {
			return errors.New("listener is not TCP")
		}
		f, err := tl.File()
		if err != nil {
			return fmt.Errorf("dup listening socket: %w", err)
		}
		defer f.Close()
		if err := start(rolePortHolder, nil, []*os.File{f}); err != nil {
			return err
		}
	}
	return nil
}

func serverArgsLine(a args) string {
	q := func(name string) string {
		v := a.str(name)
		if v == "" {
			return "None"
		}
		return "'" + v + "'"
	}
	n := func(name string) string {
		v := a.str(name)
		if v == "" {
			return "None"
		}
		return v
	}
	b := func(name string) string { return pyBool(a.on(name)) }
	return fmt.Sprintf("server_args=ServerArgs(model_path=%s, tokenizer_path=%s, tokenizer_mode='auto', load_format='auto', trust_remote_code=%s, dtype='%s', kv_cache_dtype='%s', quantization=%s, context_length=%s, served_model_name=%s, chat_template=%s, host='%s', port=%s, mem_fraction_static=%s, max_running_requests=%s, max_total_tokens=%s, chunked_prefill_size=%s, max_prefill_tokens=%s, schedule_policy='%s', tp_size=%s, pp_size=%s, dp_size=%s, random_seed=%s, log_level='%s', log_requests=%s, enable_metrics=%s, decode_log_interval=%s, api_key=%s, reasoning_parser=%s, tool_call_parser=%s, speculative_algorithm=%s, speculative_draft_model_path=%s, speculative_num_steps=%s, speculative_eagle_topk=%s, speculative_num_draft_tokens=%s, mamba_full_memory_ratio=%s, disable_cuda_graph=%s, cuda_graph_max_bs=%s, disable_radix_cache=%s, enable_torch_compile=%s, attention_backend=%s)",
		q("model-path"), q("tokenizer-path"), b("trust-remote-code"), a.str("dtype"), a.str("kv-cache-dtype"), q("quantization"), n("context-length"),
		q("served-model-name"), q("chat-template"), a.str("host"), a.str("port"), n("mem-fraction-static"), n("max-running-requests"), n("max-total-tokens"),
		n("chunked-prefill-size"), a.str("max-prefill-tokens"), a.str("schedule-policy"), a.str("tp-size"), a.str("pp-size"), a.str("dp-size"), n("random-seed"),
		a.str("log-level"), b("log-requests"), b("enable-metrics"), a.str("decode-log-interval"), apiKey(a), q("reasoning-parser"), q("tool-call-parser"),
		q("speculative-algorithm"), q("speculative-draft-model-path"), n("speculative-num-steps"), n("speculative-eagle-topk"), n("speculative-num-draft-tokens"),
		a.str("mamba-full-memory-ratio"), b("disable-cuda-graph"), n("cuda-graph-max-bs"), b("disable-radix-cache"), b("enable-torch-compile"), q("attention-backend"))
}

// apiKey never prints the key itself.
func apiKey(a args) string {
	if a.str("api-key") == "" {
		return "None"
	}
	return "'***'"
}
