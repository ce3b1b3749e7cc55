"""The FAISS indexes over stored vectors: rebuilt from the store, kept in sync with its changes."""
