# The quickstart: the agent's main job on any Linux machine, with no GPU, no Incus and no
# network. A fake SGLang (internal/fakesglang: SGLang's flags, log lines and endpoints)
# stands in for the real server; small placeholder weights stand in for the checkpoint.
# run.sh walks through plan → apply → a no-op plan → a changed flag → a verified relaunch.

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

file "model_config" {
  path    = "${var.root}/models/Qwen3.6-27B/config.json"
  content = jsonencode({ architectures = ["Qwen3NextForCausalLM"], model_type = "qwen3_next", tie_word_embeddings = false })
  mode    = "0644"
}

file "weights" {
  path    = "${var.root}/models/Qwen3.6-27B/model-00001-of-00001.safetensors"
  content = "placeholder weights: the quickstart serves no real model\n"
  mode    = "0644"
}

server "qwen" {
  command = [var.fake_sglang]
  flags = {
    "model-path"                   = dirname(file.model_config.path)
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
  depends_on = [file.weights]

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
