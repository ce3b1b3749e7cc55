"""Traffic control: rate limits, coalescing, breakers, refusals, per-request controls, tenant limits."""
