"""What the training process hands its DataLoader workers: instructions (control), the rank's plan (sharing, planfiles)."""
