# An inference container: an Incus system container with GPUs passed through and the
# model weights bind-mounted read-only. It runs as is against any Incus daemon that has a
# "busybox" image (the test suite's private daemon has one); the comments say what
# changes on a real GPU host. See docs/containers.md.
#
#   agent plan  -var incus_socket=/var/lib/incus/unix.socket -var model_root=/srv/models examples/containers
#   agent apply -var incus_socket=/var/lib/incus/unix.socket -var model_root=/srv/models examples/containers

variable "incus_socket" {
  default = "/var/lib/incus/unix.socket"
}

variable "model_root" {
  description = "host directory holding the model weights"
}

variable "container_name" {
  default = "sglang" # the tests pass a unique name: LXC names host cgroups after it
}

variable "image" {
  # Real host: an image with a glibc userspace, e.g. "ubuntu-24.04" (a local alias).
  default = "busybox"
}

agent {
  incus_socket = var.incus_socket
}

container "sglang" {
  name         = var.container_name
  image        = var.image
  profiles     = ["default"]
  description  = "SGLang inference server"
  stop_timeout = "30s"

  config = {
    "limits.processes" = 4096 # numbers and booleans are sent as strings
    "user.agent.role"  = "inference"
    # Real host: "limits.memory" = "96GiB"
  }

  # Real host: one gpu block per GPU, selected by PCI address (nvidia-smi
  # --query-gpu=pci.bus_id, or ls /dev/dri/by-path). The test daemon has no GPU, so
  # these are commented out:
  #
  # gpu "gpu0" { pci = "0000:01:00.0" }
  # gpu "gpu1" { pci = "0000:02:00.0" }

  disk "models" {
    source   = var.model_root
    path     = "/models"
    readonly = true
    # shift = true   # only when the files must appear owned by the container's root
  }

  # Real host: the userspace driver inside must equal the host's kernel module.
  # nvidia_userspace = "580.95.05"
}
