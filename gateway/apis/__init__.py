"""One adapter per API (chat, completions, responses, messages, embeddings, passthrough) and the one pipeline every API route runs."""
