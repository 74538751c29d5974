# TestChaosRevert's plan: one server on the fake SGLang whose change (faults, mem) makes
# the new generation die with an OOM after a slow start, so that kills of `agent run`
# land in the stop, the failed launch, the rejection and the rolled-back launch.

agent {
  metrics_listen = var.metrics_listen
}

variable "metrics_listen" {}
variable "root" {}
variable "fake_sglang" {}
variable "model" {}
variable "port" { type = number }
variable "mem" { type = number }
variable "faults" {}

server "qwen" {
  command = [var.fake_sglang]
  flags = {
    "model-path"          = var.model
    "port"                = var.port
    "mem-fraction-static" = var.mem
  }
  env = {
    FAKE_SGLANG                 = var.faults
    FAKE_SGLANG_DECODE_INTERVAL = "0"
  }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "500ms"
  }
  stop {
    timeout = "5s"
  }
  log_dir   = "${var.root}/logs"
  keep_logs = 1000 # every launch's log stays, to be counted
}
