"""What the training process hands its DataLoader workers: instructions (control), the rank's plan (sharing),
and an epoch's plan computed once per node (planfiles, nodeplan, planlock)."""
