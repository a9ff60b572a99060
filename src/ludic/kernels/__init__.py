"""Hand-tuned kernels: speed-ups behind the plain PyTorch / transformers path."""
