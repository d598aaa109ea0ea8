"""Why a real model's massive activation sets a stage's max error by one rounding (fast_path_compare.py's rule for
massive elements). On the CPU, HF transformers float32, SmolLM2-135M-Instruct converted from its GGUF:

    python -m tinyvllm.cli convert /tmp/gg/smol.gguf /tmp/gg/smol-hf
    python scripts/massive_activation_rounding.py --model /tmp/gg/smol-hf [--layer 11] [--prompt 1]

For one chat prompt of fast_path_compare.py, the layer's MLP is recomputed in float64 from HF float32's own input
three ways: exactly; as the fast path rounds (input and silu(gate) * up to bf16 once, float32-exact products); as
HF bf16 rounds (input, gate, up, silu, the product and the output each to bf16). It prints token 0's largest output
(the attention-sink channel), each way's error there, and the down_proj terms that make it: a handful of products,
so the error is the rounding of one or two bf16 activations, a draw, not a statistic.
"""
import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="/tmp/gg/smol-hf")
    parser.add_argument("--layer", type=int, default=11)
    parser.add_argument("--prompt", type=int, default=1, help="index into fast_path_compare's chat prompts")
    args = parser.parse_args()
    import ml_dtypes
    from fast_path_compare import prompts_for
    from goldens.hf_reference import capture_stages, load_hf_model
    from tinyvllm.model.config import ModelConfig
    model_dir = Path(args.model)
    prompt = prompts_for(model_dir, ModelConfig.from_model_dir(model_dir).vocab_size, False, 0)[args.prompt]
    hf = load_hf_model(model_dir)
    stages = capture_stages(hf, prompt)
    x = stages[f"layers.{args.layer}.post_norm"].astype(np.float64)
    ref = stages[f"layers.{args.layer}.mlp"].astype(np.float64)
    mlp = hf.model.layers[args.layer].mlp
    w_gate, w_up, w_down = (m.weight.detach().double().numpy() for m in (mlp.gate_proj, mlp.up_proj, mlp.down_proj))

    def bf16(a):
        return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)

    def silu(g):
        return g / (1 + np.exp(-g))

    token, channel = 0, int(np.abs(ref[0]).argmax())
    exact = (silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T
    xb = bf16(x)
    act = silu(xb @ w_gate.T) * (xb @ w_up.T)
    fast = bf16(act) @ w_down.T
    gate, up = bf16(xb @ w_gate.T), bf16(xb @ w_up.T)
    hf_bf16 = bf16(bf16(bf16(silu(gate)) * up) @ w_down.T)
    others = np.sort(np.abs(ref).max(axis=1))[-2]
    print(f"layer {args.layer}, prompt {args.prompt} ({len(prompt)} tokens): token {token} channel {channel} = "
          f"{ref[token, channel]:.6g} (the next largest token's max: {others:.4g})")
    for name, value in (("float64 from the float32 input", exact), ("the fast path's roundings", fast),
                        ("HF bf16's roundings", hf_bf16)):
        print(f"  {name}: error {value[token, channel] - ref[token, channel]:+.4g}")
    ulp = 2.0 ** (np.floor(np.log2(abs(ref[token, channel]))) - 7)
    print(f"  one bf16 ulp at that value: {ulp:g}")
    terms = act[token] * w_down[channel]
    print("  largest down_proj terms (act, w, act x w, what rounding act to bf16 moves the output by):")
    for j in np.argsort(-np.abs(terms))[:4]:
        print(f"    j={j}: {act[token, j]:.6g} x {w_down[channel, j]:.6g} = {terms[j]:.6g}, "
              f"{(bf16(act[token, j]) - act[token, j]) * w_down[channel, j]:+.4g}")


if __name__ == "__main__":
    main()
