# kpro6: the decommissioned host, kept for the record and for the migration's export.
hostname = "kpro6"
gpu0_pci = "0000:41:00.0"
gpu1_pci = "0000:81:00.0"
