"""The model's weights on the device: uploaded once, q/k/v and gate/up concatenated so each is one projection."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kernels_numba.common import cuda

from tinyvllm.model.config import ModelConfig


@dataclass
class LayerWeights:
    """One decoder layer's weights. q/k/v and gate/up are stored concatenated along the output features
    ([Wq; Wk; Wv] and [Wg; Wu]) so each pair or triple is one projection: one launch, one pass over x."""
    input_norm: object
    qkv_proj: object      # [(n_heads + 2 n_kv_heads) head_dim, hidden]
    o_proj: object
    post_norm: object
    gate_up_proj: object  # [2 intermediate, hidden]
    down_proj: object


@dataclass
class DeviceWeights:
    """Every weight of the model on the device, uploaded once, all of one dtype: uint16 bf16 bit patterns, or
    float32 for a checkpoint with F32 or F16 tensors (tinyvllm.model.weights; kernels_numba.weight_dtype)."""
    embed_tokens: object
    layers: list[LayerWeights]
    norm: object
    lm_head: object

    @classmethod
    def upload(cls, config: ModelConfig, host: dict[str, np.ndarray],
               progress: Callable[[int, int], None] | None = None) -> "DeviceWeights":
        total, done = len(host), 0

        def to_device(*names: str):
            nonlocal done
            arrays = [host[n] for n in names]
            device = cuda.to_device(np.ascontiguousarray(arrays[0] if len(arrays) == 1 else np.concatenate(arrays)))
            done += len(names)
            if progress:
                progress(done, total)
            return device

        def layer(i: int) -> LayerWeights:
            p = f"model.layers.{i}."
            return LayerWeights(
                input_norm=to_device(p + "input_layernorm.weight"),
                qkv_proj=to_device(*(p + f"self_attn.{n}_proj.weight" for n in "qkv")),
                o_proj=to_device(p + "self_attn.o_proj.weight"),
                post_norm=to_device(p + "post_attention_layernorm.weight"),
                gate_up_proj=to_device(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                down_proj=to_device(p + "mlp.down_proj.weight"),
            )

        embed = to_device("model.embed_tokens.weight")
        layers = [layer(i) for i in range(config.num_hidden_layers)]
        norm = to_device("model.norm.weight")
        lm_head = embed if config.tie_word_embeddings else to_device("lm_head.weight")
        return cls(embed_tokens=embed, layers=layers, norm=norm, lm_head=lm_head)
