"""The runtime the datasets stand on: the training process's instructions to DataLoader workers (control) and
each process's position among them (progress), the rank's plan in shared memory (sharing), an epoch's plan
computed once per node (planfiles, nodeplan), memory handed back after planning (memory), and the record of
what each process yielded (yieldlog)."""
