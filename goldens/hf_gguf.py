"""The independent reference for GGUF models: HF transformers reading the .gguf itself.

transformers' own GGUF code (transformers.modeling_gguf_pytorch_utils: its config mapping, `gguf`
dequantization and its own undoing of llama.cpp's q/k permutation) builds a float32 LlamaForCausalLM.
`from_pretrained(..., gguf_file=...)` does the same but insists on `accelerate`, which the GPU machine
lacks, so this calls the function it calls. With `bf16_weights` every weight is rounded to bf16 (nearest
even) and widened back: the values tinyvllm computes with for a quantized file (an unquantized F32 one it
keeps as it is), so a comparison measures the compute alone.
"""
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint


def has_quantized_tensors(gguf_file) -> bool:
    """Whether any tensor is stored quantized (not F32, F16 or BF16): then tinyvllm computes with the
    dequantized weights rounded to bf16, else with the file's values as they are (docs/gguf.md)."""
    from gguf import GGUFReader
    return any(t.tensor_type.name not in ("F32", "F16", "BF16") for t in GGUFReader(gguf_file).tensors)


def load_hf_gguf_model(gguf_file, device="cpu", bf16_weights=None) -> LlamaForCausalLM:
    """bf16_weights: round every weight to bf16 (default: when the file is quantized, as tinyvllm does)."""
    gguf_file = Path(gguf_file)
    config = AutoConfig.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    config._attn_implementation = "eager"
    try:
        model = LlamaForCausalLM._from_config(config, dtype=torch.float32)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = LlamaForCausalLM._from_config(config, torch_dtype=torch.float32)
    try:
        tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=model)["tensors"]
    except TypeError:  # older transformers: no model_to_load, Llama names mapped by the architecture alone
        tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True)["tensors"]
    state = {name: t.to(torch.float32) for name, t in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if "lm_head.weight" in missing:
        assert config.tie_word_embeddings, "the GGUF has no output.weight but embeddings are not tied"
        model.lm_head.weight = model.model.embed_tokens.weight
    if bf16_weights or (bf16_weights is None and has_quantized_tensors(gguf_file)):
        round_weights_to_bf16(model)
    return model.to(device).eval()


@torch.no_grad()
def round_weights_to_bf16(model) -> None:
    """Every parameter rounded to bf16 (nearest even) and kept in float32: the weights tinyvllm computes with."""
    for param in model.parameters():
        param.copy_(param.to(torch.bfloat16).to(torch.float32))


def load_hf_gguf_tokenizer(gguf_file):
    gguf_file = Path(gguf_file)
    return AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
