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

The three last folders carry a README.md naming the file each template and token list was copied from.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from make_assets import train_bpe  # scripts/make_assets.py, from this script's folder

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "tiny_models"
VOCAB_SIZE = 1024

# google/gemma-3-4b-it's tokenizer special tokens (names as released; ids here are this tokenizer's own).
GEMMA3_SPECIAL = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
    "<image_soft_token>",
]  # fmt: skip
# google/gemma-3-4b-it's chat_template.json (a system turn folds into the first user turn; "assistant" is "model");
# byte for byte TRL 1.16's copy of it (trl/chat_templates/gemma3.jinja).
GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n"
    '    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = "" -%}\n'
    "    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    '        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}\n'
    "    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n"
)

# HuggingFaceTB/SmolVLM-Instruct's special tokens and chat template (byte for byte TRL 1.16's
# trl/chat_templates/smolvlm.jinja).
IDEFICS3_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>",
    *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)],
]  # fmt: skip
IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{message['role'] | capitalize}}"
    "{% if message['content'][0]['type'] == 'image' %}{{':'}}{% else %}{{': '}}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{line['text']}}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


# Qwen3.5's special tokens (Qwen/Qwen3.5-2B tokenizer_config.json: Qwen3-VL's plus reasoning and tool tokens).
QWEN3_5_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>",
    "</think>",
]  # fmt: skip

# google/paligemma-3b-pt-224's special tokens (its Gemma tokenizer's, plus the `<image>` placeholder); the 1024
# `<locYYYY>` and 128 `<segSSS>` tokens follow as ordinary tokens (as `PaliGemmaProcessor` adds them: `EXTRA_TOKENS`).
PALIGEMMA_SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<image>"]

# OpenGVLab/InternVL3-1B-hf's tokenizer: Qwen2.5-VL's special tokens plus InternVL's image and grounding tokens
# (transformers' src/transformers/models/internvl/convert_internvl_weights_to_hf.py, `write_tokenizer`).
INTERNVL_SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<img>", "</img>", "<IMG_CONTEXT>", "<quad>", "</quad>", "<ref>", "</ref>",
    "<box>", "</box>", "<video>",
]  # fmt: skip
# The chat template that convert_internvl_weights_to_hf.py writes into the released OpenGVLab/InternVL3-*-hf
# folders (its `chat_template`), verbatim: one `<IMG_CONTEXT>` line per image where the message puts it, which
# `InternVLProcessor` expands to `<img>` + `<IMG_CONTEXT>` x (image_seq_length x tiles) + `</img>`.
INTERNVL_TEMPLATE = (
    "{% for message in messages %}"
        "{{'<|im_start|>' + message['role'] + '\\n'}}"
        "{% if message['content'] is string %}"
            "{{ message['content'] }}"
        "{% else %}"
            "{% for content in message['content'] %}"
                "{% if content['type'] == 'image' %}"
                    "{{ '<IMG_CONTEXT>\\n' }}"
                "{% elif content['type'] == 'video' %}"
                    "{{ '<video>\\n' }}"
                "{% elif content['type'] == 'text' %}"
                    "{{ content['text'] }}"
                "{% endif %}"
            "{% endfor %}"
        "{% endif %}"
        "{{'<|im_end|>\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
        "{{'<|im_start|>assistant\\n' }}"
    "{% endif %}"
)  # fmt: skip

# llava-hf/llava-onevision-qwen2-0.5b-ov-hf: Qwen2's tokenizer plus `<image>` and `<video>`, and the chat template
# that transformers' src/transformers/models/llava_onevision/convert_llava_onevision_weights_to_hf.py writes into
# the released folders (its `chat_template`), verbatim: every image of a message first (`<image>\n` each), then its
# text.
LLAVA_ONEVISION_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "<video>"]
LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n'}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}"
    "{# Render all video then #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}{{ '<video>\\n' }}{% endfor %}"
    "{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] }}{% endfor %}"
    "{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}"
    "{{ content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# zai-org/GLM-4.1V-9B-Thinking's special tokens (names as released: GLM-4's chat and role tokens, its image and video
# wrappers, reasoning and box tokens; ids here are this tokenizer's own).
GLM4V_SPECIAL = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>",
    "<|observation|>", "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>", "<|image|>",
    "<|video|>", "<think>", "</think>", "<|begin_of_box|>", "<|end_of_box|>",
]  # fmt: skip
# zai-org/GLM-4.1V-9B-Thinking's chat template (revision 3c1471e51dc811b589d4d12b1c1c7c1c941267c2), copied from a
# public record of it that also gives its sha256 (of its JSON string; checked in `build_glm4v`): no transformers
# file carries it.
GLM4V_TEMPLATE_SHA256 = "5232dbe7ee947df4d2009f2b262b70a22d4f2d2f0590e2af4ef2a78096171e90"
GLM4V_TEMPLATE = (
    '[gMASK]<sop>\n'
    '{%- for msg in messages %}\n'
    "    {%- if msg.role == 'system' %}\n"
    '<|system|>\n'
    '{{ msg.content }}\n'
    "    {%- elif msg.role == 'user' %}\n"
    "<|user|>{{ '\\n' }}\n"
    '\n'
    '        {%- if msg.content is string %}\n'
    '{{ msg.content }}\n'
    '        {%- else %}\n'
    '            {%- for item in msg.content %}\n'
    "                {%- if item.type == 'video' or 'video' in item %}\n"
    '<|begin_of_video|><|video|><|end_of_video|>\n'
    "                {%- elif item.type == 'image' or 'image' in item %}\n"
    '<|begin_of_image|><|image|><|end_of_image|>\n'
    "                {%- elif item.type == 'text' %}\n"
    '{{ item.text }}\n'
    '                {%- endif %}\n'
    '            {%- endfor %}\n'
    '        {%- endif %}\n'
    "    {%- elif msg.role == 'assistant' %}\n"
    '        {%- if msg.metadata %}\n'
    '<|assistant|>{{ msg.metadata }}\n'
    '{{ msg.content }}\n'
    '        {%- else %}\n'
    '<|assistant|>\n'
    '{{ msg.content }}\n'
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{% if add_generation_prompt %}<|assistant|>\n'
    '{% endif %}'
)  # fmt: skip


BUILT = "Built by `python scripts/make_family_assets.py` ({fn}); the weights are drawn from a seed by\n`mmrl.policy.vlm.tiny.build_tiny` (`model.path=tiny:{name}`), so the folder holds none.\n\n"
PALIGEMMA_README = (
    """# Tiny PaliGemma

"""
    + BUILT.format(fn="build_paligemma", name="paligemma")
    + """Special tokens: google/paligemma-3b-pt-224's (`<pad>`, `<eos>`, `<bos>`, `<unk>`, `<image>`), then the 1024
`<locYYYY>` and 128 `<segSSS>` tokens, which transformers' `PaliGemmaProcessor` adds (`EXTRA_TOKENS` in
src/transformers/models/paligemma/processing_paligemma.py).

No chat template: PaliGemma has none. Its processor writes the prompt (`PaliGemmaProcessor.prepare_inputs_layout`):
`<image>` x images + `<bos>` + prefix + `\\n`, each `<image>` then `image_seq_length` tokens; the model answers with
the suffix. mmrl writes the same (`mmrl.families`, "paligemma") and refuses a conversation for it.
"""
)
INTERNVL_README = (
    """# Tiny InternVL 3

"""
    + BUILT.format(fn="build_internvl", name="internvl")
    + """Chat template (chat_template.jinja): verbatim the `chat_template` of transformers'
src/transformers/models/internvl/convert_internvl_weights_to_hf.py, the script that wrote the released
OpenGVLab/InternVL3-*-hf folders. Special tokens: that script's `write_tokenizer` (Qwen2.5-VL's tokens plus `<img>`,
`</img>`, `<IMG_CONTEXT>`, `<quad>`, `</quad>`, `<ref>`, `</ref>`, `<box>`, `</box>`, and `<video>`).
"""
)
LLAVA_ONEVISION_README = (
    """# Tiny LLaVA-OneVision

"""
    + BUILT.format(fn="build_llava_onevision", name="llava_onevision")
    + """Chat template (chat_template.jinja): verbatim the `chat_template` of transformers'
src/transformers/models/llava_onevision/convert_llava_onevision_weights_to_hf.py, the script that wrote the released
llava-hf/llava-onevision-qwen2-*-ov-hf folders. Special tokens: Qwen2's, plus the `<image>` and `<video>` that script
adds. processor_config.json: that script's `vision_feature_select_strategy="full"`, with `num_image_tokens` the
tiny tower's (729 in the release).
"""
)

GLM4V_README = (
    """# Tiny GLM-4.1V

"""
    + BUILT.format(fn="build_glm4v", name="glm4v")
    + """Chat template (chat_template.jinja): zai-org/GLM-4.1V-9B-Thinking's, revision
3c1471e51dc811b589d4d12b1c1c7c1c941267c2, verbatim; no transformers file carries it, so it was copied from a public
record of that revision's processor ("official_chat_template") together with its sha256, which
`scripts/make_family_assets.py` checks. Special tokens: the release's names for GLM-4's chat and role tokens, the
image and video wrappers, `<think>`/`</think>` and the box tokens (not its full added-token list). EOS tokens as its
generation config: `<|endoftext|>`, `<|user|>`, `<|observation|>`.
"""
)


def qwen3_5_template() -> str:
    """Qwen3.5-2B's chat template (thinking off by default), as TRL ships it (trl/chat_templates/, a copy of the
    released one that TRL compares tokenizers' templates against). TRL is in the `bench` extra."""
    from importlib.resources import files

    return (files("trl") / "chat_templates" / "qwen3_5_nothink.jinja").read_text()


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
        chat_template=qwen3_5_template(),
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


def main() -> None:
    build_gemma3(OUT / "gemma3")
    build_idefics3(OUT / "idefics3")
    build_idefics3(OUT / "smolvlm", model_type="smolvlm")
    build_qwen3_5(OUT / "qwen3_5")
    build_paligemma(OUT / "paligemma")
    build_internvl(OUT / "internvl")
    build_llava_onevision(OUT / "llava_onevision")
    build_glm4v(OUT / "glm4v")
    names = ("gemma3", "idefics3", "smolvlm", "qwen3_5", "paligemma", "internvl", "llava_onevision", "glm4v")
    print(f"wrote {', '.join(str(OUT / name) for name in names)}")


if __name__ == "__main__":
    main()
