"""Build the tiny folders of the non-Qwen model families under assets/tiny_models/, deterministically.

    python scripts/make_family_assets.py

Each folder is laid out as the family's checkpoints on the hub, less the weights (drawn from a seed by
`mmrl.policy.vlm.tiny.build_tiny`): config.json (the real `transformers` config class at tiny size), the image
processor's preprocessor_config.json, processor_config.json (the processor's own numbers), and a tokenizer with the
family's real special tokens and its real chat template: a byte-level BPE trained locally with `tokenizers` on the
same corpus as assets/tokenizer (scripts/make_assets.py), the special tokens added first so their ids are small.

- gemma3: Gemma 3 (`Gemma3ForConditionalGeneration`): a SigLIP tower on 32 px images (8 px patches), pooled to 4 soft
  tokens an image (`mm_tokens_per_image`; 256 in the released checkpoints), 2 language layers (one sliding-window,
  one global, as Gemma 3 alternates them), `<start_of_turn>user` / `<start_of_turn>model` turns.
- qwen3_5: Qwen3.5 (`Qwen3_5ForConditionalGeneration`), natively multimodal with hybrid attention: 4 language
  layers alternating Gated DeltaNet (linear attention with a recurrent state) and full attention, Qwen3-VL's vision
  tower (16 px patches, 2x2 merge), Qwen's vision and chat tokens plus `<think>`/`</think>` and the tool tokens, and
  Qwen3.5-2B's chat template (thinking off: the generation prompt holds an empty `<think></think>` block).
- idefics3: Idefics3 / SmolVLM v1 (`Idefics3ForConditionalGeneration`): images resized to 64 px on the longest side and
  split into 32 px tiles plus a global view, 4 `<image>` tokens a tile (pixel shuffle by 2), a 2-layer Llama, the
  `User:` / `Assistant:` turns closed by `<end_of_utterance>`.
- smolvlm: SmolVLM2 (`SmolVLMForConditionalGeneration`), the same sizes, tokens and template as idefics3.
- paligemma: PaliGemma (`PaliGemmaForConditionalGeneration`): a SigLIP tower on 32 px images (16 `<image>` tokens an
  image), a 2-layer Gemma, the `<locYYYY>`/`<segSSS>` tokens, and no chat template (its processor writes the prompt).
- internvl: InternVL 3 (`InternVLForConditionalGeneration`): 32 px tiles (at most 4 plus a thumbnail), 4
  `<IMG_CONTEXT>` tokens a tile, a 2-layer Qwen2, the released -hf folders' chat template.
- llava_onevision: LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`): a SigLIP tower on 32 px tiles, anyres
  grid pinpoints of 32-64 px, a 2-layer Qwen2, the released -hf folders' chat template.

- gemma4: Gemma 4 (`Gemma4ForConditionalGeneration`): a 1-layer vision tower on 4 px patches, each image resized
  (aspect ratio kept) within a budget of 70 soft tokens (the smallest the image processor takes; 280 by default in
  the release), pooled 3 x 3; a 2-layer language model (one sliding-window, one global layer) with per-layer inputs
  and bidirectional attention within an image, `<|turn>user` / `<|turn>model` turns closed by `<turn|>`.

The folders of PaliGemma, InternVL, LLaVA-OneVision, GLM-4.1V and Gemma 4 carry a README.md naming the file each
template and token list was copied from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from family_tokens import (  # scripts/family_tokens.py: the special tokens, templates and READMEs of each folder
    GEMMA3_SPECIAL,
    GEMMA3_TEMPLATE,
    GEMMA4_README,
    GEMMA4_SPECIAL,
    GLM4V_README,
    GLM4V_SPECIAL,
    GLM4V_TEMPLATE,
    GLM4V_TEMPLATE_SHA256,
    IDEFICS3_SPECIAL,
    IDEFICS3_TEMPLATE,
    INTERNVL_README,
    INTERNVL_SPECIAL,
    INTERNVL_TEMPLATE,
    LLAVA_ONEVISION_README,
    LLAVA_ONEVISION_SPECIAL,
    LLAVA_ONEVISION_TEMPLATE,
    PALIGEMMA_README,
    PALIGEMMA_SPECIAL,
    QWEN3_5_SPECIAL,
    trl_template,
)
from make_assets import train_bpe  # scripts/make_assets.py, from this script's folder

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "tiny_models"
VOCAB_SIZE = 1024


def write(
    out: Path, tokenizer, model_type: str, config: dict, image_processor, processor: dict, readme: str = ""
) -> None:
    from transformers import AutoConfig

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if readme:  # where the folder's conventions come from
        (out / "README.md").write_text(readme.strip() + "\n")
    tokenizer.save_pretrained(out)
    AutoConfig.for_model(model_type, **config).save_pretrained(out)
    image_processor.save_pretrained(out)
    if processor:
        (out / "processor_config.json").write_text(json.dumps(processor, indent=2, sort_keys=True) + "\n")


def build_gemma3(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(GEMMA3_SPECIAL, VOCAB_SIZE),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        additional_special_tokens=GEMMA3_SPECIAL[4:],
        extra_special_tokens={
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },  # fmt: skip
        chat_template=GEMMA3_TEMPLATE,
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in GEMMA3_SPECIAL}
    config = dict(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, max_position_embeddings=4096, sliding_window=512,
            layer_types=["sliding_attention", "full_attention"], pad_token_id=ids["<pad>"],
            eos_token_id=[ids["<eos>"], ids["<end_of_turn>"]], bos_token_id=ids["<bos>"],
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
            patch_size=8, vision_use_head=False,
        ),
        mm_tokens_per_image=4,
        boi_token_index=ids["<start_of_image>"],
        eoi_token_index=ids["<end_of_image>"],
        image_token_index=ids["<image_soft_token>"],
    )  # fmt: skip
    image_processor = Gemma3ImageProcessorPil(size={"height": 32, "width": 32})
    write(out, tok, "gemma3", config, image_processor, {"image_seq_length": 4})


def build_idefics3(out: Path, model_type: str = "idefics3") -> None:
    """Idefics3, or SmolVLM2 (`model_type="smolvlm"`: the same layout and tokens, SmolVLM's own classes)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil
    from transformers.models.smolvlm.image_processing_pil_smolvlm import SmolVLMImageProcessorPil

    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(IDEFICS3_SPECIAL, VOCAB_SIZE),
        pad_token="<|endoftext|>",
        eos_token="<end_of_utterance>",
        bos_token="<|im_start|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=IDEFICS3_SPECIAL[1:],
        chat_template=IDEFICS3_TEMPLATE,
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in IDEFICS3_SPECIAL[:5]}
    config = dict(
        text_config=dict(
            model_type="llama", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
            pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<end_of_utterance>"],
            bos_token_id=ids["<|im_start|>"],
        ),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        scale_factor=2,
        image_token_id=ids["<image>"],
    )  # fmt: skip
    image_processor_class = {"idefics3": Idefics3ImageProcessorPil, "smolvlm": SmolVLMImageProcessorPil}[model_type]
    image_processor = image_processor_class(size={"longest_edge": 64}, max_image_size={"longest_edge": 32})
    # image_seq_len = (image_size / patch_size)**2 / scale_factor**2 = 16 / 4
    write(out, tok, model_type, config, image_processor, {"image_seq_len": 4})


def build_qwen3_5(out: Path) -> None:
    from transformers import Qwen2TokenizerFast
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = Qwen2TokenizerFast(
        tokenizer_object=train_bpe(QWEN3_5_SPECIAL, VOCAB_SIZE),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=QWEN3_5_SPECIAL[1:],
        chat_template=trl_template("qwen3_5_nothink"),
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in QWEN3_5_SPECIAL}
    config = dict(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
            linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=4096,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
            pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=None,
            rope_parameters={
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1], "mrope_interleaved": True,
                "partial_rotary_factor": 0.25,
            },
        ),
        vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                           num_position_embeddings=64, patch_size=16),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
    )  # fmt: skip
    # Qwen3-VL's image processor settings (assets/tiny_models/qwen3_vl): 16 px patches, 2x2 merge, small images.
    settings = json.loads((OUT / "qwen3_vl" / "preprocessor_config.json").read_text())
    image_processor = Qwen2VLImageProcessorPil(**{k: v for k, v in settings.items() if k != "image_processor_type"})
    write(out, tok, "qwen3_5", config, image_processor, {})


def build_paligemma(out: Path) -> None:
    """PaliGemma (`PaliGemmaForConditionalGeneration`): a SigLIP tower on 32 px images (8 px patches: 16 image
    tokens an image, `image_seq_length`; 256 in paligemma-3b-pt-224), a 2-layer Gemma, no chat template (the
    processor writes the prompt: `<image>` x tokens + `<bos>` + prefix + `\\n`)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.paligemma.processing_paligemma import EXTRA_TOKENS
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(PALIGEMMA_SPECIAL, VOCAB_SIZE),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        additional_special_tokens=["<image>"],
        extra_special_tokens={"image_token": "<image>"},
        model_max_length=4096,
    )
    tok.add_tokens(EXTRA_TOKENS)  # as the released tokenizer holds them (the processor adds any that are missing)
    ids = {t: tok.convert_tokens_to_ids(t) for t in PALIGEMMA_SPECIAL}
    config = dict(
        text_config=dict(
            model_type="gemma", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, head_dim=32, max_position_embeddings=4096,
            pad_token_id=ids["<pad>"], eos_token_id=ids["<eos>"], bos_token_id=ids["<bos>"],
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=32,
            patch_size=8, projection_dim=64, vision_use_head=False,
        ),
        projection_dim=64,
        image_token_id=ids["<image>"],
        pad_token_id=ids["<pad>"],
    )  # fmt: skip
    image_processor = SiglipImageProcessorPil(size={"height": 32, "width": 32}, image_seq_length=16)
    write(out, tok, "paligemma", config, image_processor, {}, PALIGEMMA_README)


def build_internvl(out: Path) -> None:
    """InternVL 3 (`InternVLForConditionalGeneration`): an InternViT tower on 32 px tiles (8 px patches, pixel
    shuffle 0.5: 4 `<IMG_CONTEXT>` tokens a tile, `image_seq_length`; 256 in InternVL3-1B-hf), each image cropped
    to at most 4 tiles plus a thumbnail (`crop_to_patches`, as `InternVLProcessor` asks; 12 in the release), a
    2-layer Qwen2, Qwen's `<|im_start|>` / `<|im_end|>` turns."""
    from transformers import Qwen2TokenizerFast
    from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import GotOcr2ImageProcessorPil

    tok = Qwen2TokenizerFast(
        tokenizer_object=train_bpe(INTERNVL_SPECIAL, VOCAB_SIZE),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=INTERNVL_SPECIAL[1:],
        extra_special_tokens={
            "start_image_token": "<img>",
            "end_image_token": "</img>",
            "context_image_token": "<IMG_CONTEXT>",
            "video_token": "<video>",
        },  # fmt: skip
        chat_template=INTERNVL_TEMPLATE,
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in INTERNVL_SPECIAL}
    config = dict(
        text_config=dict(
            model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
            pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=None,
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=[32, 32],
            patch_size=[8, 8], use_absolute_position_embeddings=True,
        ),
        image_token_id=ids["<IMG_CONTEXT>"],
        image_seq_length=4,
        downsample_ratio=0.5,
    )  # fmt: skip
    image_processor = GotOcr2ImageProcessorPil(
        size={"height": 32, "width": 32}, max_patches=4, image_mean=[0.485, 0.456, 0.406],
        image_std=[0.229, 0.224, 0.225],
    )  # fmt: skip
    write(out, tok, "internvl", config, image_processor, {"image_seq_length": 4}, INTERNVL_README)


def build_llava_onevision(out: Path) -> None:
    """LLaVA-OneVision (`LlavaOnevisionForConditionalGeneration`): a SigLIP tower on 32 px tiles (8 px patches: 16
    features a tile, `num_image_tokens`; 729 in the release), "anyres" tiling of a lone image over the grid
    pinpoints 32-64 px (384-2304 in the release) plus a base view and one newline feature per feature row, a
    single unpadded tile an image when a prompt holds several; a 2-layer Qwen2, `<|im_start|>` / `<|im_end|>`
    turns."""
    from transformers import Qwen2TokenizerFast
    from transformers.models.llava_onevision.image_processing_pil_llava_onevision import (
        LlavaOnevisionImageProcessorPil,
    )

    tok = Qwen2TokenizerFast(
        tokenizer_object=train_bpe(LLAVA_ONEVISION_SPECIAL, VOCAB_SIZE),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=LLAVA_ONEVISION_SPECIAL[1:],
        extra_special_tokens={"image_token": "<image>", "video_token": "<video>"},
        chat_template=LLAVA_ONEVISION_TEMPLATE,
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in LLAVA_ONEVISION_SPECIAL}
    pinpoints = [[32, 32], [32, 64], [64, 32], [64, 64]]
    config = dict(
        text_config=dict(
            model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
            pad_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], bos_token_id=None,
        ),
        vision_config=dict(
            model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
            num_attention_heads=2, image_size=32, patch_size=8, vision_use_head=False,
        ),
        image_token_id=ids["<image>"],
        video_token_id=ids["<video>"],
        image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        vision_aspect_ratio="anyres_max_9",
    )  # fmt: skip
    image_processor = LlavaOnevisionImageProcessorPil(
        size={"height": 32, "width": 32}, image_grid_pinpoints=pinpoints,
    )  # fmt: skip
    processor = {
        "num_image_tokens": 16,
        "vision_feature_select_strategy": "full",
        "vision_aspect_ratio": "anyres_max_9",
    }
    write(out, tok, "llava_onevision", config, image_processor, processor, LLAVA_ONEVISION_README)


def build_glm4v(out: Path) -> None:
    """GLM-4.1V (`Glm4vForConditionalGeneration`): Qwen2-VL's vision layout (8 px patches, 2 frames, 2x2 merge,
    images bounded to 32-64 px squares), M-RoPE over a 2-layer GLM-4 language model, the release's template."""
    import hashlib

    from transformers import PreTrainedTokenizerFast
    from transformers.models.glm4v.image_processing_pil_glm4v import Glm4vImageProcessorPil

    if hashlib.sha256(json.dumps(GLM4V_TEMPLATE).encode()).hexdigest() != GLM4V_TEMPLATE_SHA256:
        raise ValueError("GLM4V_TEMPLATE is not the recorded release template (sha256 differs)")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(GLM4V_SPECIAL, VOCAB_SIZE),
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=GLM4V_SPECIAL[1:],
        extra_special_tokens={"image_token": "<|image|>", "video_token": "<|video|>"},
        chat_template=GLM4V_TEMPLATE,
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in GLM4V_SPECIAL}
    config = dict(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=4096, pad_token_id=ids["<|endoftext|>"],
            eos_token_id=[ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]],
            rope_parameters={
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3], "partial_rotary_factor": 0.5,
            },
        ),
        vision_config=dict(
            depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, image_size=32,
            patch_size=8, spatial_merge_size=2, temporal_patch_size=2,
        ),
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
    )  # fmt: skip
    image_processor = Glm4vImageProcessorPil(
        patch_size=8, temporal_patch_size=2, merge_size=2, size={"shortest_edge": 32 * 32, "longest_edge": 64 * 64},
    )  # fmt: skip
    write(out, tok, "glm4v", config, image_processor, {}, GLM4V_README)


def build_gemma4(out: Path) -> None:
    """Gemma 4 (`Gemma4ForConditionalGeneration`): a 1-layer vision tower on 4 px patches pooled 3 x 3 (at most 70
    soft tokens an image, `max_soft_tokens`; 280 by default in the release, on 16 px patches), no audio tower, a
    2-layer language model (sliding window, then global) with per-layer inputs, bidirectional attention within an
    image (`use_bidirectional_attention="vision"`; transformers' code says the smaller released models leave it
    off), logits soft-capped at 30."""
    from transformers import PreTrainedTokenizerFast
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    tok = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(GEMMA4_SPECIAL, VOCAB_SIZE),
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        additional_special_tokens=GEMMA4_SPECIAL[4:],
        extra_special_tokens={
            "image_token": "<|image|>",
            "boi_token": "<|image>",
            "eoi_token": "<image|>",
            "audio_token": "<|audio|>",
            "boa_token": "<|audio>",
            "eoa_token": "<audio|>",
        },  # fmt: skip
        chat_template=trl_template("gemma4_v5"),
        model_max_length=4096,
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in GEMMA4_SPECIAL}
    config = dict(
        text_config=dict(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, global_head_dim=32, max_position_embeddings=4096, sliding_window=512,
            layer_types=["sliding_attention", "full_attention"], vocab_size_per_layer_input=len(tok),
            hidden_size_per_layer_input=8, final_logit_softcapping=30.0, use_bidirectional_attention="vision",
            pad_token_id=ids["<pad>"], bos_token_id=ids["<bos>"],
            eos_token_id=[ids["<eos>"], ids["<turn|>"], ids["<|tool_response>"]],
        ),
        vision_config=dict(
            hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
            head_dim=16, patch_size=4, pooling_kernel_size=3, position_embedding_size=256,
        ),
        audio_config=None,
        boi_token_id=ids["<|image>"],
        eoi_token_id=ids["<image|>"],
        image_token_id=ids["<|image|>"],
        video_token_id=ids["<|video|>"],
        boa_token_id=ids["<|audio>"],
        eoa_token_index=ids["<audio|>"],
        audio_token_id=ids["<|audio|>"],
    )  # fmt: skip
    image_processor = Gemma4ImageProcessorPil(patch_size=4, max_soft_tokens=70, pooling_kernel_size=3)
    write(out, tok, "gemma4", config, image_processor, {}, GEMMA4_README)


def main() -> None:
    build_gemma3(OUT / "gemma3")
    build_idefics3(OUT / "idefics3")
    build_idefics3(OUT / "smolvlm", model_type="smolvlm")
    build_qwen3_5(OUT / "qwen3_5")
    build_paligemma(OUT / "paligemma")
    build_internvl(OUT / "internvl")
    build_llava_onevision(OUT / "llava_onevision")
    build_glm4v(OUT / "glm4v")
    build_gemma4(OUT / "gemma4")
    names = ("gemma3", "idefics3", "smolvlm", "qwen3_5", "paligemma", "internvl", "llava_onevision", "glm4v", "gemma4")
    print(f"wrote {', '.join(str(OUT / name) for name in names)}")


if __name__ == "__main__":
    main()
