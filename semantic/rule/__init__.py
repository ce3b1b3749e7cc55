"""The decision rule: may a stored answer serve this prompt (guards, near-duplicates, verifier, calibration)."""
