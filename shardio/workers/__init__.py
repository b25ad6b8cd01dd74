"""Worker processes: shardio's own loader (loader), and what the training process hands DataLoader workers:
instructions (control), the rank's plan (sharing), and an epoch's plan computed once per node (planfiles,
nodeplan, planlock)."""
