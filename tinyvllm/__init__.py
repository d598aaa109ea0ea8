"""tinyvllm: a reference LLM inference engine for Llama-architecture models, every kernel in numba.cuda.

    from tinyvllm import LLM, SamplingParams
    LLM().generate(["The sun rose"], SamplingParams(temperature=0, max_tokens=8))
"""

__version__ = "0.1.0"
__all__ = ["LLM", "LLMEngine", "EngineConfig", "SamplingParams", "RequestOutput"]


def __getattr__(name):
    # Lazy, so `import tinyvllm` does not import numba before the caller chose simulator or GPU.
    if name == "LLM":
        from tinyvllm.llm import LLM
        return LLM
    if name in ("LLMEngine", "EngineConfig", "RequestOutput"):
        from tinyvllm.engine import engine
        return getattr(engine, name)
    if name == "SamplingParams":
        from tinyvllm.engine.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'tinyvllm' has no attribute {name!r}")
