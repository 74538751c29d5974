# The fakes variant, for tests: no GPU, no network. The driver is observed in a fake
# host root (AGENT_HOST_ROOT), the container is created stopped in a private Incus (its
# GPUs cannot start without GPUs), the weights come from a local fake Hub, and the fake
# SGLang serves on the host. The test sets the per-run paths with -var on top:
# incus_socket, container_name, model_root, hf_endpoint, hf_token_file, sglang_command,
# log_dir.
hostname            = "kpro5"
gpu0_pci            = "0000:01:00.0"
gpu1_pci            = "0000:c1:00.0"
persistence_mode    = null
image               = "busybox"
container_running   = false
server_in_container = false
sglang_env          = { CUDA_VISIBLE_DEVICES = "0,1", FAKE_SGLANG = "crash-after=2m", FAKE_SGLANG_DECODE_INTERVAL = "100ms" }
port                = 23961
ready_timeout       = "20s"
