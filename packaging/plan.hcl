# /etc/agent/plan.hcl: the plan `agent run` keeps this host converged to
# (agent.service). Edit it and save: the agent reloads it within seconds (or run
# `systemctl reload agent`); a plan that does not load is logged and the last good one
# keeps running. Check an edit first with `agent plan /etc/agent/plan.hcl`.
# Reference: /usr/share/doc/agent/docs/plan-language.md and docs/server.md.
#
# As shipped, nothing is managed: the agent only serves its endpoints.

agent {
  # /metrics, /status and /healthz (loopback only).
  metrics_listen = "127.0.0.1:9464"
  # interval = "30s"
}

# Model weights from the Hugging Face Hub, resumable and verified:
#
# download "qwen" {
#   dest = "/srv/models/Qwen3.6-27B"
#   huggingface {
#     repo       = "Qwen/Qwen3.6-27B"
#     revision   = "main"
#     token_file = "/etc/agent/hf-token"   # mode 0600
#   }
# }

# An SGLang server, relaunched (verified) when its flags change:
#
# server "qwen" {
#   command = ["python3", "-m", "sglang.launch_server"]
#   flags = {
#     "model-path"          = download.qwen.dest
#     "tp-size"             = 2
#     "port"                = 30000
#     "mem-fraction-static" = 0.85
#   }
#   env = { CUDA_VISIBLE_DEVICES = "0,1" }
#   ready {
#     http    = "/health"
#     timeout = "20m"
#   }
# }
