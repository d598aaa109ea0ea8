"""`tinyvllm trace`, the debugger's headless twin: stage list, one stage's stats, golden diff and values."""
import numpy as np

from kernels_numba.common import SIMULATOR
from tinyvllm.cli import main
from tinyvllm.golden_check import DEFAULT_GOLDENS, Goldens


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_list_names_every_stage_in_order(capsys):
    code, out, err = run(capsys, "trace", "--list")
    names = out.split()
    assert code == 0 and len(names) == 3 + 10 * 2
    assert names[:3] == ["embedding", "layers.0.input_norm", "layers.0.q"] and names[-2:] == ["final_norm", "logits"]


def test_a_stage_of_the_first_golden_prompt_prints_stats_golden_and_values(capsys):
    golden = Goldens.load(DEFAULT_GOLDENS).prompts[0]["embedding"]
    code, out, err = run(capsys, "trace", "--stage", "embedding", "--rows", "2", "--cols", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("step 0 stage embedding: kernel embedding.embedding")
    assert lines[1].startswith(f"shape {golden.shape} float32  min {golden.min():.6g}  max {golden.max():.6g}")
    assert lines[2].startswith("golden p0 (request 0): max abs 0.000e+00") and lines[2].endswith("PASS")
    assert lines[3] == f"values [0:2, 0:3] of {golden.shape[0]} x 64 (tokens x features):"
    printed = np.array([[float(v) for v in line.split(":")[1].split()] for line in lines[4:6]])
    np.testing.assert_allclose(printed, golden[:2, :3], rtol=1e-4)  # printed with 5 significant digits


def test_a_decode_step_stage_has_no_golden(capsys):
    code, out, err = run(capsys, "trace", "--stage", "layers.0.k", "--prompt", "The sun", "--step", "1",
                         "--no-goldens", "--max-model-len", "16")
    assert code == 0, err
    first = out.splitlines()[0]
    # k comes from the q stage's q|k|v projection + rope_qkv; on a GPU a one-token step runs the fused-GEMV layer
    # (KernelPlan.fused_gemv_layer), where input_norm's gemv_fused (RopeKVEpilogue) computes q, k and v
    computed_by = "layers.0.q" if SIMULATOR else "layers.0.input_norm"
    assert first.startswith(f"step 1 stage layers.0.k: kernel (computed by {computed_by})")
    assert "shape (1, 2, 16) float32" in out and "golden: absent (no golden file)" in out


def test_bad_stage_names_and_missing_steps_get_one_line(capsys):
    code, out, err = run(capsys, "trace", "--stage", "layers.9.q")
    assert code == 1 and err.splitlines()[-1] == "error: unknown stage 'layers.9.q': --list shows the 23 stage names"
    code, out, err = run(capsys, "trace", "--stage", "logits", "--prompt", "Hi", "--max-tokens", "1", "--step", "3",
                         "--no-goldens")
    assert code == 1 and "did not run in step 3" in err


def test_no_goldens_without_a_prompt_says_there_is_nothing_to_run(capsys):
    code, out, err = run(capsys, "trace", "--stage", "layers.0.attn", "--no-goldens")
    assert code == 1 and err.splitlines()[-1].startswith("error: nothing to run: without --prompt TEXT")
