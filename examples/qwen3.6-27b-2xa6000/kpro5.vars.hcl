# kpro5: the new host (2× RTX A6000). agent plan main.hcl -var-file kpro5.vars.hcl
hostname = "kpro5"
gpu0_pci = "0000:01:00.0"
gpu1_pci = "0000:c1:00.0"
