"""tinyvllm: a reference LLM inference engine for Llama-architecture models, every kernel in numba.cuda."""

__version__ = "0.1.0"
