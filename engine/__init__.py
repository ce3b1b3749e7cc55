"""The in-process generator: Llama-family model over a paged KV cache, scheduler, async client."""
