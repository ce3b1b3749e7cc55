"""The semantic answer cache: scope, embedder, FAISS index over a Redis store, decision rule."""
