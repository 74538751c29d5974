// Command agent is a declarative provisioning agent for GPU inference hosts.
package main

func main() {}
