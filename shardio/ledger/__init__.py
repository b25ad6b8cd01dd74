"""The data ledger: trace what a saved state read, quarantine samples and re-mix at resume."""
