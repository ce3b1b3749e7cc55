"""Paged KV block accounting with hash-chained exact prefix reuse. Pure Python: no torch, no engine."""
