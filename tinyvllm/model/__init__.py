"""The model: from a Hugging Face directory or a GGUF file to weights on the device and a tokenizer.

    from tinyvllm.model import load_model
    model = load_model()   # the demo model; or load_model("path/to/Llama-3.2-1B-Instruct")

Modules in reading order:
    loader.py            load_model -> LoadedModel: config, tokenizer, generation defaults, device weights
    config.py            ModelConfig (config.json, validated) and GenerationDefaults (generation_config.json)
    weights.py           safetensors read directly: {tensor name: array}, every tensor checked against the config
    device_weights.py    DeviceWeights.upload: the weights on the device, q/k/v and gate/up concatenated
    tokenizer.py         Tokenizer: text <-> ids, chat messages -> prompt ids
    chat_template.py     the chat template rendered as transformers renders it; Llama 3.2's template
    gguf/                a GGUF file read as the same config, tokenizer and weights (and `tinyvllm convert`)
    llama3_tokenizer.py  Llama 3's split regex and special tokens; tokenizer.json from Meta's tokenizer.model
    fixtures/            models the project builds itself: the demo model and seeded random models
    demo_model/          the committed demo model (what fixtures/demo.py builds), the default model
"""

__all__ = ["GenerationDefaults", "LoadedModel", "ModelConfig", "load_model"]


def __getattr__(name):
    # Lazy, as in tinyvllm/__init__.py: importing the config must not import numba (loader.py does).
    if name in ("load_model", "LoadedModel"):
        from tinyvllm.model import loader
        return getattr(loader, name)
    if name in ("ModelConfig", "GenerationDefaults"):
        from tinyvllm.model import config
        return getattr(config, name)
    raise AttributeError(f"module 'tinyvllm.model' has no attribute {name!r}")
