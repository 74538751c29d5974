# The container plan of the chaos test (TestChaosContainer), modelled on
# examples/containers/containers.hcl: a busybox system container on the test's private
# Incus daemon, with the host directory of "weights" bind-mounted read-only. The test
# changes it after every converged apply so that kills land in in-place updates (a
# config value, a disk added or removed) and in restarts (a restart key); it also deletes
# the instance every fourth epoch, so that they land in creations:
#
#   user.epoch            = the epoch number: an in-place update every epoch
#   disk "cache"          = present in odd epochs: the lines between the markers are
#                           dropped in even ones (the plan language has no dynamic blocks)
#   limits.kernel.nofile  = changes in epochs 2, 6, 10, …: LXC reads it at start, a restart
#
# and a file in the weights directory says which epoch wrote it.

variable "incus_socket" {}
variable "container_name" {}
variable "root" {
  description = "host directory holding the disks' sources"
}
variable "epoch" {
  type = number
}
variable "nofile" {
  type = number
}

agent {
  incus_socket = var.incus_socket
}

container "sglang" {
  name         = var.container_name
  image        = "busybox"
  profiles     = ["default"]
  description  = "chaos: SGLang inference container"
  stop_timeout = "5s"

  config = {
    "user.agent.role"      = "inference"
    "user.epoch"           = var.epoch
    "limits.kernel.nofile" = var.nofile
  }

  disk "weights" {
    source   = "${var.root}/weights"
    path     = "/models"
    readonly = true
  }

  # chaos:cache begin
  disk "cache" {
    source = "${var.root}/cache"
    path   = "/cache"
  }
  # chaos:cache end
}

file "epoch" {
  path    = "${var.root}/weights/epoch.txt"
  content = "epoch ${var.epoch}\n"
  mode    = "0644"
}
