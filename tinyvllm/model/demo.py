"""The demo model: a tiny random-weight Llama 3 that runs in the CUDA simulator in seconds.

`build_demo_model(out_dir)` writes an ordinary Hugging Face Llama directory (config.json,
generation_config.json, tokenizer.json, tokenizer_config.json, model.safetensors) shaped like Llama 3.2
Instruct in every way an engine can notice: GQA, llama3 RoPE scaling (head_dim 16 puts frequencies in all
three wavelength bands), tied embeddings, BF16 weights, a byte-level BPE with Llama 3's pre-tokenizer and
its 256 special tokens after the regular vocabulary, and Meta's chat template. Only the sizes are small.
Everything is deterministic (fixed seeds, sorted JSON keys), so a rebuild reproduces the committed files.

    python -m tinyvllm.model.demo [--out DIR]
"""
import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from tinyvllm.model.chat_template import LLAMA32_CHAT_TEMPLATE
from tinyvllm.model.llama3_tokenizer import LLAMA3_SPECIAL_TOKENS, LLAMA3_SPLIT_PATTERN

DEMO_MODEL_DIR = Path(__file__).parent / "demo_model"

STOP_TOKENS = ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"]
CHAT_FORMAT_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>"] + STOP_TOKENS

PROSE = """\
The sun rose slowly over the quiet town, and the bakers were the first to open their doors.
A small dog ran along the river, chasing the birds that landed near the water.
Maria walked to the market every Saturday morning to buy fresh bread, apples and cheese.
The old library had thousands of books, but the best ones were hidden on the top shelf.
When it rains in the mountains, the streams turn white and loud for a few days.
He wrote a letter to his sister, who lived far away in a city by the sea.
The teacher asked the children to count the stars they could see from the window.
Learning to play the piano takes patience, practice and a little bit of courage.
In the evening the streets were full of people talking, laughing and eating outside.
The train to the north leaves at seven o'clock, so we should be at the station by half past six.
Computers follow instructions exactly; they do what we say, not what we mean.
A good cup of tea needs hot water, a few minutes of waiting and someone to share it with.
The scientists measured the temperature of the lake every hour for three weeks.
She planted tomatoes, beans and sunflowers in the garden behind the house.
Our neighbours painted their fence blue, and now the whole street looks brighter.
It was the first time the team had won the cup in twenty years.
If you mix yellow and blue paint, you get green; if you mix red and white, you get pink.
The moon does not make its own light; it reflects the light of the sun.
Water boils at one hundred degrees at sea level, but at a lower temperature high in the mountains.
There are seven days in a week, twelve months in a year and about three hundred and sixty five days.
The museum opens at ten and closes at five, except on Mondays when it is closed all day.
Bees visit flowers to collect nectar, and they carry pollen from one plant to the next.
The cat slept in the sun all afternoon and woke up only when it heard the door.
My grandfather told stories about the ships he sailed on when he was young.
Reading before bed helps many people relax and fall asleep more easily.
The recipe says to bake the cake for forty minutes, or until a knife comes out clean.
Clouds form when warm air rises, cools down and the water in it turns into tiny drops.
The bridge was built in 1889 and it is still used by cars, bikes and people on foot.
Please remember to turn off the lights and close the windows when you leave.
A map shows the roads, the rivers and the towns, but it cannot show the smell of the forest.
"""

# (system message or "", user, assistant): rendered below in the Llama 3 chat layout (without the special
# tokens), so the BPE learns the template's words and chat prompts stay short.
CHATS = [
    ("", "What is the capital of France?", "The capital of France is Paris."),
    ("", "How many legs does a spider have?", "A spider has eight legs."),
    ("", "Can you tell me a short story about a dragon?",
     "Once upon a time, a small dragon lived in a cave near the sea. It was afraid of the dark, so it "
     "learned to make a tiny flame and carried it everywhere it went."),
    ("You are a helpful assistant.", "What is two plus three?", "Two plus three is five."),
    ("", "Why is the sky blue?",
     "Sunlight is made of many colours. The air scatters blue light more than red light, so when we look "
     "up we see blue from every direction."),
    ("", "Hello! Who are you?",
     "Hello! I am a small helpful assistant. I can answer questions, explain ideas and help you write."),
    ("Be brief.", "Write a poem about the sea.", "The sea is wide, the sea is deep, it sings the sailors off to sleep."),
    ("", "What should I cook for dinner tonight?",
     "You could make a simple pasta with tomatoes, garlic and olive oil. It is quick and tasty."),
    ("You are a helpful assistant.", "How do I say thank you in Spanish?", "In Spanish you say gracias."),
    ("", "Give me three tips for learning a new language.",
     "Practice a little every day, listen to people speaking it, and do not be afraid of mistakes."),
    ("Be brief.", "What is the largest planet in our solar system?", "Jupiter."),
    ("", "Explain what a computer program is.",
     "A computer program is a list of instructions that tells a computer what to do, step by step."),
    ("You are a friendly teacher.", "What is a noun?", "A noun is a word for a person, a place or a thing."),
    ("", "Hi!", "Hi! How can I help you today?"),
    ("Be brief.", "What colour is grass?", "Green."),
    ("Be brief.", "Hi!", "Hi!"),
    ("", "What day comes after Monday?", "Tuesday comes after Monday."),
    ("Be brief.", "Hi! What can you do?", "I answer questions."),
    ("Be brief.", "Is the moon a planet?", "No."),
    ("Be brief.", "How many days are in a week?", "Seven."),
    ("", "Thank you for your help!", "You are welcome! Let me know if you have any other questions."),
]
CHAT_HEADER = "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"


def _chat_transcript(system: str, user: str, assistant: str) -> str:
    return f"system\n\n{CHAT_HEADER}{system}\nuser\n\n{user}\nassistant\n\n{assistant}\n"


CORPUS = PROSE + "".join(_chat_transcript(*chat) for chat in CHATS)


@dataclass(frozen=True)
class DemoModelSpec:
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    regular_vocab_size: int = 384
    max_position_embeddings: int = 2048
    seed: int = 20240726
    # Tied embeddings: logits = final_norm(h) @ E.T, and final_norm(h) has unit RMS, so a logit has
    # std ~ embed_std * sqrt(hidden_size); 0.35 * 8 ~ 3 gives peaked, non-flat distributions.
    embed_std: float = 0.35
    # 2/sqrt(hidden_size): large enough that attention and MLP outweigh the input token's own embedding
    # in the residual stream; at 0.12 and below greedy decoding falls into one token repeated forever.
    linear_std: float = 0.25
    norm_noise_std: float = 0.1
    # Rows of tokens the corpus never produces (odd bytes, reserved specials) shrink, as untrained rows
    # do in real checkpoints, so greedy text is made of the corpus' word pieces.
    unused_embed_scale: float = 0.1

    @property
    def vocab_size(self) -> int:
        return self.regular_vocab_size + len(LLAMA3_SPECIAL_TOKENS)

    def special_id(self, token: str) -> int:
        return self.regular_vocab_size + LLAMA3_SPECIAL_TOKENS.index(token)


def build_tokenizer(spec: DemoModelSpec) -> Tokenizer:
    """Byte-level BPE trained on CORPUS, then the Llama 3 special tokens at regular_vocab_size.. ."""
    tokenizer = Tokenizer(models.BPE(ignore_merges=True))  # as Llama 3: a whole-word vocab hit wins
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.regular_vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([CORPUS], trainer)
    assert tokenizer.get_vocab_size() == spec.regular_vocab_size, tokenizer.get_vocab_size()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL_TOKENS])
    bos = LLAMA3_SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0",
        pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
        special_tokens=[(bos, spec.special_id(bos))],
    )
    assert tokenizer.get_vocab_size() == spec.vocab_size
    return tokenizer


def model_config(spec: DemoModelSpec) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": spec.max_position_embeddings,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "tie_word_embeddings": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": spec.special_id("<|begin_of_text|>"),
        "eos_token_id": [spec.special_id(t) for t in STOP_TOKENS],
    }


def generation_config(spec: DemoModelSpec) -> dict:
    return {
        "bos_token_id": spec.special_id("<|begin_of_text|>"),
        "eos_token_id": [spec.special_id(t) for t in STOP_TOKENS],
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.9,
    }


def tokenizer_config(spec: DemoModelSpec) -> dict:
    added = {
        str(spec.special_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True,
        }
        for t in LLAMA3_SPECIAL_TOKENS
    }
    return {
        "added_tokens_decoder": added,
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": LLAMA32_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,  # byte-level BPE decodes exactly; no space "clean-up"
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": spec.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }


def used_token_ids(tokenizer: Tokenizer, spec: DemoModelSpec) -> list[int]:
    """Ids the corpus encodes to, plus the special tokens of the chat format."""
    ids = set(tokenizer.encode(CORPUS, add_special_tokens=False).ids)
    return sorted(ids | {spec.special_id(t) for t in CHAT_FORMAT_TOKENS})


def random_weights(spec: DemoModelSpec, used_ids: list[int]) -> dict[str, np.ndarray]:
    """Seeded normal init, rounded to bf16 (ml_dtypes.bfloat16). Tied embeddings: no lm_head.weight."""
    rng = np.random.default_rng(spec.seed)
    H, I, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q_dim, kv_dim = spec.num_attention_heads * hd, spec.num_key_value_heads * hd

    def normal(shape, std):
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    def norm_weight():
        return 1.0 + normal((H,), spec.norm_noise_std)

    embed = normal((spec.vocab_size, H), spec.embed_std)
    row_scale = np.full((spec.vocab_size, 1), spec.unused_embed_scale, dtype=np.float32)
    row_scale[used_ids] = 1.0
    weights = {"model.embed_tokens.weight": embed * row_scale}
    for i in range(spec.num_hidden_layers):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm_weight()
        weights[p + "self_attn.q_proj.weight"] = normal((q_dim, H), spec.linear_std)
        weights[p + "self_attn.k_proj.weight"] = normal((kv_dim, H), spec.linear_std)
        weights[p + "self_attn.v_proj.weight"] = normal((kv_dim, H), spec.linear_std)
        weights[p + "self_attn.o_proj.weight"] = normal((H, q_dim), spec.linear_std)
        weights[p + "post_attention_layernorm.weight"] = norm_weight()
        weights[p + "mlp.gate_proj.weight"] = normal((I, H), spec.linear_std)
        weights[p + "mlp.up_proj.weight"] = normal((I, H), spec.linear_std)
        weights[p + "mlp.down_proj.weight"] = normal((H, I), spec.linear_std)
    weights["model.norm.weight"] = norm_weight()
    return {name: w.astype(ml_dtypes.bfloat16) for name, w in weights.items()}


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def build_demo_model(out_dir, spec: DemoModelSpec = DemoModelSpec()) -> list[Path]:
    """Write the demo model directory; returns the files written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", model_config(spec))
    _write_json(out_dir / "generation_config.json", generation_config(spec))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(spec))
    tokenizer = build_tokenizer(spec)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    weights = random_weights(spec, used_token_ids(tokenizer, spec))
    save_file(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    names = ["config.json", "generation_config.json", "tokenizer_config.json", "tokenizer.json",
             "model.safetensors"]
    return [out_dir / n for n in names]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Build the tinyvllm demo model (tiny random-weight Llama 3).")
    parser.add_argument("--out", type=Path, default=DEMO_MODEL_DIR, help="output directory")
    args = parser.parse_args(argv)
    for path in build_demo_model(args.out):
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
