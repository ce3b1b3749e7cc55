"""Sentence embeddings: where the model comes from, ONNX Runtime or torch, micro-batched off the loop."""
