"""Errors a user can act on. The CLI prints a TinyVLLMError's message and exits 1, without a traceback."""


class TinyVLLMError(Exception):
    """Base of every error whose message alone tells the user what went wrong."""


class ModelLoadError(TinyVLLMError):
    """A model directory, config or checkpoint that tinyvllm cannot load."""
