# gpu-check: observe the NVIDIA driver and the GPUs of this host, change nothing.
#
# There is no installer and no package, so the agent can never install anything from
# this plan; the wanted version is the loaded one, which run.sh reads from
# /proc/driver/nvidia/version and passes as -var driver_version=…. `agent status` then
# prints what NVML sees: the driver and CUDA versions, each GPU with its memory and
# persistence mode, and the processes using it.

variable "driver_version" {
  description = "The loaded NVIDIA kernel module's version, e.g. 580.95.05."
}

nvidia_driver "host" {
  version           = var.driver_version
  blacklist_nouveau = false # observe only: never plan a blacklist
}
