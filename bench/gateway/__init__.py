"""Through HTTP: end to end, the hit path, workers, load, Redis faults, soak, and their wrk/GPTCache helpers."""
