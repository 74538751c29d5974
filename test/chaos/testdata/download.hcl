# Added beside examples/quickstart/quickstart.hcl by the chaos test: a download served by
# the test's own throttled HTTP server on loopback, so kills land mid-transfer.

variable "blob_url" {}
variable "blob_sha256" {}
variable "blob_size" {
  type = number
}

download "blob" {
  file "blob.bin" {
    url    = var.blob_url
    sha256 = var.blob_sha256
    size   = var.blob_size
  }
  dest             = "${var.root}/blobs"
  checkpoint_every = 262144
  concurrency      = 1
}
