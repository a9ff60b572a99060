"""The HTTP server over the embedded engine that speaks vLLM's routes (``python -m ludic.inference.server``)."""
