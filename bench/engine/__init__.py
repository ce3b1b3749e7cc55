"""Engine benchmarks: kernels, the model, serving, beside llama-server; the prefix cache and its routing."""
