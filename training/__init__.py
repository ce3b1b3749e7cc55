"""The verifier's training: its trainer, the minimal-pair generator, their recipes (README.md)."""
