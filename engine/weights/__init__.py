"""Where the weights come from and how they are stored: model files, GGUF tensors, formats, auto choice."""
