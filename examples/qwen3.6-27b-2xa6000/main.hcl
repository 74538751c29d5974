# The seed deployment: Qwen3.6-27B (BF16, 52 GB) on 2× RTX A6000, served by SGLang with
# MTP speculative decoding, in an Incus container that has both GPUs and the weights
# mounted read-only. One variable file per host: -var-file kpro5.vars.hcl.
#
# PLACEHOLDERS, to replace before a real apply: the installer's sha256 and the model's
# revision (the Hub commit to pin). Both are marked PLACEHOLDER below.

agent {
  state_dir    = var.state_dir
  incus_socket = var.incus_socket
}

host {
  hostname = var.hostname
}

variable "hostname" {
  description = "the only host this plan may run on (the guard)"
}
variable "gpu0_pci" {
  description = "PCI address of the first RTX A6000 (nvidia-smi --query-gpu=pci.bus_id)"
}
variable "gpu1_pci" {
  description = "PCI address of the second RTX A6000"
}
variable "state_dir" {
  default = "/var/lib/agent"
}
variable "incus_socket" {
  default = "/var/lib/incus/unix.socket"
}
variable "container_name" {
  default = "sglang"
}
variable "image" {
  default = "ubuntu-24.04"
}
variable "container_running" {
  type    = bool
  default = true
}
variable "server_in_container" {
  description = "false runs the server on the host (the fakes variant: no GPU to start the container with)"
  type        = bool
  default     = true
}
variable "persistence_mode" {
  description = "null leaves it alone (the fakes variant: it is not observable without NVML)"
  type        = bool
  default     = true
}
variable "model_root" {
  default = "/srv/models"
}
variable "hf_endpoint" {
  default = "https://huggingface.co"
}
variable "hf_revision" {
  # PLACEHOLDER: a made-up commit. Pin the real one: the "sha" of
  # https://huggingface.co/api/models/Qwen/Qwen3.6-27B/revision/main
  default = "0000000000000000000000000000000000000000"
}
variable "hf_token_file" {
  default = "/etc/agent/hf-token"
}
variable "sglang_command" {
  type    = list(string)
  default = ["python3", "-m", "sglang.launch_server"]
}
variable "sglang_env" {
  type    = map(string)
  default = { CUDA_VISIBLE_DEVICES = "0,1" }
}
variable "port" {
  type    = number
  default = 30000
}
variable "mem_fraction_static" {
  type    = number
  default = 0.85
}
variable "mamba_full_memory_ratio" {
  type    = number
  default = 0.5
}
variable "max_running_requests" {
  type    = number
  default = 8
}
variable "ready_timeout" {
  default = "20m"
}
variable "log_dir" {
  default = "/var/log/agent"
}

nvidia_driver "host" {
  version = "580.95.05"
  installer {
    url = "https://us.download.nvidia.com/XFree86/Linux-x86_64/580.95.05/NVIDIA-Linux-x86_64-580.95.05.run"
    # PLACEHOLDER: not the installer's digest. Write the output of
    # sha256sum NVIDIA-Linux-x86_64-580.95.05.run here before applying.
    sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
  }
  persistence_mode = var.persistence_mode
  reboot           = "never"
}

download "qwen" {
  huggingface {
    repo       = "Qwen/Qwen3.6-27B"
    revision   = var.hf_revision
    include    = ["*.safetensors", "*.json", "tokenizer*", "*.txt", "*.jinja"]
    token_file = var.hf_token_file
    endpoint   = var.hf_endpoint
  }
  dest        = "${var.model_root}/Qwen3.6-27B"
  concurrency = 4
}

container "sglang" {
  name     = var.container_name
  image    = var.image
  profiles = ["default"]
  config   = { "limits.memory" = "96GiB" }
  running  = var.container_running
  gpu "gpu0" {
    pci = var.gpu0_pci
  }
  gpu "gpu1" {
    pci = var.gpu1_pci
  }
  disk "models" {
    source   = download.qwen.dest
    path     = "/models"
    readonly = true
  }
}

server "qwen" {
  container = var.server_in_container ? container.sglang.name : null
  command   = var.sglang_command
  flags = {
    "model-path"        = var.server_in_container ? "/models" : download.qwen.dest
    "served-model-name" = "Qwen3.6-27B"
    "tp-size"           = 2
    "port"              = var.port
    "enable-metrics"    = true
    "trust-remote-code" = true
    # Hybrid GDN model: the Mamba state cache needs room beside the KV cache.
    "mem-fraction-static"     = var.mem_fraction_static
    "mamba-full-memory-ratio" = var.mamba_full_memory_ratio
    "max-running-requests"    = var.max_running_requests
    # MTP speculative decoding (97-100% accept rate, ~60 tok/s on this host).
    "speculative-algorithm"        = "NEXTN"
    "speculative-num-steps"        = 3
    "speculative-eagle-topk"       = 1
    "speculative-num-draft-tokens" = 4
  }
  env  = var.sglang_env
  port = var.port

  ready {
    http     = "/health"
    log_line = "The server is fired up and ready to roll!"
    timeout  = var.ready_timeout
  }
  stop {
    signal  = "SIGTERM"
    timeout = "90s"
  }
  smoke_test {
    prompt = "What is 2+2? Answer with one number."
    # The model card's sampling for non-thinking mode. Greedy or unpenalised sampling
    # makes this model loop: a looping answer is a sampling problem, not a server fault.
    sampling       = { temperature = 0.7, top_p = 0.8, top_k = 20, presence_penalty = 1.5 }
    max_tokens     = 512
    expect         = "4"
    max_repetition = 0.3
  }
  log_dir = var.log_dir
}
