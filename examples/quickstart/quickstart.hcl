# The quickstart: the agent's main job on any Linux machine, with no GPU, no Incus and no
# network. A fake SGLang (internal/fakesglang: SGLang's flags, log lines and endpoints)
# stands in for the real server; a small model directory (examples/quickstart/model, with
# 16 MiB of placeholder weights made at run time), served by a loopback HTTP server that
# run.sh starts, stands in for the checkpoint. run.sh walks through plan → apply (the
# download, then the server launched from it) → a no-op plan → a changed flag → a verified
# relaunch → status → destroy.

agent {
  # agent run serves /metrics, /status and /healthz here; agent status asks it first.
  metrics_listen = var.metrics_listen
}

variable "metrics_listen" {
  default = "127.0.0.1:9464"
}

variable "root" {
  description = "Where the quickstart keeps its weights and logs."
  default     = "/tmp/agent-quickstart"
}

variable "model_url" {
  description = "Where the model directory is served (run.sh starts bench/downloadserve on a loopback port)."
}

variable "fake_sglang" {
  description = "Absolute path of the fake SGLang binary (run.sh builds it)."
}

variable "mem_fraction" {
  description = "--mem-fraction-static; change it to see a verified relaunch."
  type        = number
  default     = 0.85
}

variable "port" {
  type    = number
  default = 30123
}

# The weights, fetched once and verified (sha256, size); a later plan confirms them from
# the destination's manifest and a stat, without reading them again or asking the server.
download "model" {
  dest = "${var.root}/models/Qwen3.6-27B"

  file "config.json" {
    url    = "${var.model_url}/config.json"
    sha256 = "09658d872f20c3197bf532fa33c11d4760908086319aae315238459ce31b6989"
    size   = 97
  }
  file "tokenizer.json" {
    url    = "${var.model_url}/tokenizer.json"
    sha256 = "5ec4cd8c249accb1d347bf65dc3d252e50418ff6402f397d808fdf5d83718ec1"
    size   = 111
  }
  file "model.safetensors" { # 16 MiB of zeros: the fake loads nothing
    url    = "${var.model_url}/model.safetensors"
    sha256 = "080acf35a507ac9849cfcba47dc2ad83e01b75663a516279c8b9d243b719643e"
    size   = 16777216
  }
}

server "qwen" {
  command = [var.fake_sglang]
  flags = {
    "model-path"                   = download.model.dest
    "served-model-name"            = "Qwen3.6-27B"
    "port"                         = var.port
    "tp-size"                      = 2
    "mem-fraction-static"          = var.mem_fraction
    "mamba-full-memory-ratio"      = 0.9
    "max-running-requests"         = 8
    "speculative-algorithm"        = "NEXTN"
    "speculative-num-steps"        = 3
    "speculative-eagle-topk"       = 1
    "speculative-num-draft-tokens" = 4
    "enable-metrics"               = true
  }
  env = {
    CUDA_VISIBLE_DEVICES        = "0,1"
    FAKE_SGLANG                 = "slow-start=1s"
    FAKE_SGLANG_DECODE_INTERVAL = "500ms"
  }

  ready {
    http     = "/health"
    log_line = "The server is fired up and ready to roll!"
    timeout  = "60s"
  }
  stop {
    signal  = "SIGTERM"
    timeout = "10s"
  }
  smoke_test {
    prompt = "What is 2+2? Answer with one number."
    # Qwen3.6-27B's model card, non-thinking mode: greedy decoding loops endlessly.
    sampling       = { temperature = 0.7, top_p = 0.8, top_k = 20, presence_penalty = 1.5 }
    max_tokens     = 512
    expect         = "4"
    max_repetition = 0.3
  }
  log_dir = "${var.root}/logs"
}
