"""Write assets/tiny_models/pi0/: a tiny π0 (transformers' `PI0ForConditionalGeneration`) laid out as a hub folder.

    python scripts/make_tiny_pi0.py

What it writes, deterministically (no weights: `mmrl.policy.flow.build_tiny_flow` draws them from a seed):
- config.json: a `PI0Config` with a PaliGemma backbone (SigLIP 64 px / 16 px patches -> 16 tokens an image, a Gemma
  text model of hidden 64, 2 layers) and a Gemma action expert (hidden 32, 2 layers, sharing the backbone's key/value
  heads, as π0's expert must); chunks of 4 actions, state and action padded to 8 and 4 dimensions (the real π0
  pads both to 32), 4 denoising steps. About 0.3 M parameters.
- tokenizer.json, tokenizer_config.json, special_tokens_map.json: a SentencePiece-style BPE (Metaspace
  pre-tokenisation, as Gemma's) trained locally on the phrases of the robot tasks and Python's help texts, with
  PaliGemma's special tokens at PaliGemma's ids (`<pad>` 0, `<eos>` 1, `<bos>` 2, `<unk>` 3) and `<image>` after the
  vocabulary (PaliGemma's image token id 257152 is the first id past Gemma's 256000-word vocabulary plus its 1024
  location and 128 segmentation tokens; here it is the first id past this small vocabulary).
- preprocessor_config.json: `PI0ImageProcessor`'s settings (64 px, mean and std 0.5, 16 image tokens), written as
  JSON: the class itself needs torchvision, which has no CPU build on the package index, so mmrl reads the file.

The prompt follows PaliGemma's convention (what `PI0Processor` builds): `<image>` x (tokens per image x views), then
`<bos>`, the instruction, and a newline.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "tiny_models" / "pi0"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"]  # PaliGemma's ids 0..3
IMAGE_TOKEN = "<image>"
VOCAB_SIZE = 512
IMAGE_SIZE, PATCH = 64, 16


def corpus() -> list[str]:
    """The robot tasks' instructions (so they tokenise compactly) and Python's help texts."""
    import pydoc_data.topics

    rng = random.Random(0)
    colours = ["red", "green", "blue", "yellow"]
    lines = []
    for _ in range(2000):
        c = rng.choice(colours)
        lines += [f"move the gripper to the {c} disc", f"push the block onto the {c} square", f"reach the {c} target"]
    return lines + [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]


def build_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIALS, show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>", unk_token="<unk>",
        additional_special_tokens=[IMAGE_TOKEN], model_max_length=512, padding_side="left",
    )  # fmt: skip
    assert [hf.convert_tokens_to_ids(t) for t in SPECIALS] == [0, 1, 2, 3]
    return hf


def build_config(vocab_size: int, image_token_id: int):
    from transformers import PI0Config

    text = {
        "model_type": "gemma", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": vocab_size,
    }  # fmt: skip
    vision = {
        "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "patch_size": PATCH, "image_size": IMAGE_SIZE, "vision_use_head": False,
    }  # fmt: skip
    vlm = {
        "model_type": "paligemma", "text_config": text, "vision_config": vision, "projection_dim": 64,
        "image_token_id": image_token_id, "vocab_size": vocab_size,
    }  # fmt: skip
    # The expert attends to the backbone's keys and values layer by layer: same layer count, kv heads and head size.
    dit = {
        "model_type": "gemma", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    }  # fmt: skip
    return PI0Config(
        vlm_config=vlm, dit_config=dit, chunk_size=4, max_state_dim=8, max_action_dim=4, num_inference_steps=4
    )


def main() -> None:
    tokenizer = build_tokenizer()
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    config = build_config(len(tokenizer), image_token_id)
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    config.save_pretrained(OUT)
    tokenizer.save_pretrained(OUT)
    tokens_per_image = (IMAGE_SIZE // PATCH) ** 2
    image = {
        "image_processor_type": "PI0ImageProcessor", "processor_class": "PI0Processor", "do_resize": True,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "do_rescale": True, "rescale_factor": 1 / 255,
        "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": tokens_per_image,
    }  # fmt: skip
    (OUT / "preprocessor_config.json").write_text(json.dumps(image, indent=2, sort_keys=True) + "\n")
    print(f"wrote {OUT}: vocabulary {len(tokenizer)}, <image> id {image_token_id}, {tokens_per_image} tokens an image")


if __name__ == "__main__":
    main()
