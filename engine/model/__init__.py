"""The Llama-family model over a paged KV cache: config, attention, quantised linears, the native decode."""
