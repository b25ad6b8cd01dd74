"""Worker processes: shardio's own loader (loader), and what the training process hands DataLoader workers:
instructions (control) and each process's position among them (progress), the rank's plan (sharing), and an
epoch's plan computed once per node (planfiles, nodeplan, planlock)."""
