"""The decision rule, one for every language profile: may a stored answer serve this prompt (calibration, thresholds)."""
