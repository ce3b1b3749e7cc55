"""Misses answered by a fleet of model servers: pools per model, routing, health, failover, canaries."""
