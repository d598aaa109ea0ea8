"""The independent reference: Hugging Face transformers' Llama, run in float32 on the checkpoint's bf16 values.

Only this module (and scripts that use it) imports torch/transformers; the engine never does.
`capture_stages` records every stage of docs/architecture.md ("Stage names") for one sequence through
forward hooks on transformers' own modules, so the numbers come from transformers' code, not ours.
"""
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


def load_hf_model(model_dir, device="cpu") -> LlamaForCausalLM:
    """A float32 LlamaForCausalLM whose weights are exactly the checkpoint's values (bf16 -> f32 is exact).

    Built in float32 from the config and loaded by hand, never `.to(bfloat16)`: that would also round the
    rotary inv_freq buffer. Eager attention: the plain softmax(QK^T)V, the clearest reference.
    """
    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "eager"
    try:
        model = LlamaForCausalLM._from_config(config, dtype=torch.float32)
    except TypeError:  # transformers < 4.56 names it torch_dtype
        model = LlamaForCausalLM._from_config(config, torch_dtype=torch.float32)
    state = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        state.update({name: t.to(torch.float32) for name, t in load_file(shard).items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    if "lm_head.weight" in missing:
        assert config.tie_word_embeddings, "checkpoint has no lm_head.weight but embeddings are not tied"
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.to(device).eval()


def _heads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[1, T, n*hd] -> [1, n, T, hd], the layout apply_rotary_pos_emb expects."""
    return t.view(t.shape[0], t.shape[1], -1, head_dim).transpose(1, 2)


def _unheads(t: torch.Tensor) -> torch.Tensor:
    """[1, n, T, hd] -> [T, n, hd]."""
    return t[0].transpose(0, 1)


@torch.inference_mode()
def capture_stages(model: LlamaForCausalLM, input_ids) -> dict[str, np.ndarray]:
    """Run one sequence (all positions) and return {stage name: float32 array without the batch axis}."""
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long, device=model.device)[None]
    T = ids.shape[1]
    positions = torch.arange(T, device=ids.device)[None]
    head_dim = model.config.head_dim
    raw: dict[str, torch.Tensor] = {}
    hooks = []

    def keep_output(name):
        def hook(module, args, output):
            raw[name] = output[0] if isinstance(output, tuple) else output
        return hook

    def keep_input(name):
        def hook(module, args):
            raw[name] = args[0]
        return hook

    m = model.model
    hooks.append(m.embed_tokens.register_forward_hook(keep_output("embedding")))
    for i, layer in enumerate(m.layers):
        p = f"layers.{i}."
        hooks += [
            layer.input_layernorm.register_forward_hook(keep_output(p + "input_norm")),
            layer.self_attn.q_proj.register_forward_hook(keep_output(p + "q_proj")),
            layer.self_attn.k_proj.register_forward_hook(keep_output(p + "k_proj")),
            layer.self_attn.v_proj.register_forward_hook(keep_output(p + "v_proj")),
            layer.self_attn.o_proj.register_forward_pre_hook(keep_input(p + "attn")),
            layer.self_attn.o_proj.register_forward_hook(keep_output(p + "o_proj")),
            layer.post_attention_layernorm.register_forward_pre_hook(keep_input(p + "attn_residual")),
            layer.post_attention_layernorm.register_forward_hook(keep_output(p + "post_norm")),
            layer.mlp.register_forward_hook(keep_output(p + "mlp")),
            layer.register_forward_hook(keep_output(p + "output")),
        ]
    hooks.append(m.norm.register_forward_hook(keep_output("final_norm")))
    try:
        logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits
    finally:
        for h in hooks:
            h.remove()

    # q/k after RoPE: transformers' own rotary module and apply_rotary_pos_emb on the captured projections.
    cos, sin = m.rotary_emb(raw["embedding"], positions)
    stages = {"embedding": raw["embedding"][0]}
    for i in range(len(m.layers)):
        p = f"layers.{i}."
        q, k = apply_rotary_pos_emb(_heads(raw[p + "q_proj"], head_dim), _heads(raw[p + "k_proj"], head_dim),
                                    cos, sin)
        stages[p + "input_norm"] = raw[p + "input_norm"][0]
        stages[p + "q"] = _unheads(q)
        stages[p + "k"] = _unheads(k)
        stages[p + "v"] = _unheads(_heads(raw[p + "v_proj"], head_dim))
        for name in ("attn", "o_proj", "attn_residual", "post_norm", "mlp", "output"):
            stages[p + name] = raw[p + name][0]
    stages["final_norm"] = raw["final_norm"][0]
    stages["logits"] = logits[0]
    return {name: t.detach().to("cpu", torch.float32).contiguous().numpy() for name, t in stages.items()}


def stage_names(num_layers: int) -> list[str]:
    """The stage names of docs/architecture.md, in forward order."""
    per_layer = ["input_norm", "q", "k", "v", "attn", "o_proj", "attn_residual", "post_norm", "mlp", "output"]
    return ["embedding"] + [f"layers.{i}.{s}" for i in range(num_layers) for s in per_layer] + [
        "final_norm", "logits"]


@torch.inference_mode()
def greedy_continuation(model: LlamaForCausalLM, input_ids, n: int) -> list[int]:
    """n argmax tokens after input_ids (no EOS stop). Recomputes the whole sequence each step (no KV
    cache): the plain function of the model, independent of any cache API."""
    ids = torch.as_tensor(np.asarray(input_ids), dtype=torch.long, device=model.device)[None]
    out = []
    for _ in range(n):
        next_id = model(input_ids=ids, use_cache=False).logits[0, -1].argmax()
        out.append(int(next_id))
        ids = torch.cat([ids, next_id.view(1, 1)], dim=1)
    return out
