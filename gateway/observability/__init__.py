"""What kvgate tells operators: metrics, tracing, trace context, request logs, stats, reports, shadow mode."""
