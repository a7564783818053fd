"""Build every file under assets/ from scratch, deterministically. The committed assets are this script's output.

    python scripts/make_assets.py            # tokenizer + tiny configs + the demo's warm-start checkpoint
    python scripts/make_assets.py --no-warm  # skip the (few-minute) supervised warm start
    python scripts/make_assets.py --no-clip  # skip the (few-minute) tiny CLIP of the reach env
    python scripts/make_assets.py --no-base  # skip the (quarter-hour) shared multi-task base
    python scripts/make_assets.py --no-pi0   # skip the tiny π0 and its (few-minute) perception warm start

What it writes:
- assets/tokenizer/: a byte-level BPE tokenizer trained locally with `tokenizers` on Python's own help texts and
  the phrases of our synthetic tasks, with Qwen's pre-tokenisation (digits split one by one), Qwen's chat special
  tokens and Qwen2-VL's released chat template.
- assets/tiny_models/<arch>/: config.json + preprocessor_config.json for tiny Qwen2-VL, Qwen2.5-VL and Qwen3-VL
  (hidden 128, 2 layers, about 1 M parameters), and chat_template.jinja, the family's released chat template (used
  with assets/tokenizer). Weights are drawn from a seed by `mmrl.policy.vlm.tiny.build_tiny`.
- assets/tiny_models/qwen3_vl_warm_start/: the shared warm start every tiny preset starts from, a tiny Qwen3-VL (4 language layers) after a
  supervised cold start on the grounding task (as the RL papers do before RL) that ends by imitating a sloppy
  demonstrator whose boxes are 40% too large on every side; saved in float16 to stay small.
- assets/tiny_models/qwen3_vl_base/: a shared multi-task base: the warm start after 1600 more supervised steps on the
  exact scripted answers of grounding, shape_questions and gui_click, round-robin (scripts/make_tiny_base.py, which
  prints its per-family validation); float16. It needs the warm start, so it is built after it.
- assets/tiny_models/clip_reach/: a tiny CLIP trained on the reach env's own egocentric renders with captions from
  its privileged state, the model of `reward="clip"` (scripts/make_tiny_clip.py, which prints its held-out figures).
- assets/tiny_models/pi0/ and pi0_warm_start/: the tiny π0's config and tokenizer, and the warm start of
  configs/pi0_reach_tiny.yaml: that π0 drawn from seed 0 with its vision tower trained by a perception probe on reach
  frames labelled from the privileged state (scripts/make_tiny_pi0.py, which prints the probe's validation losses).
"""

from __future__ import annotations

import argparse
import random
import shutil
from pathlib import Path

from make_tiny_base import make_tiny_base  # scripts/make_tiny_base.py, from this script's folder as warmstart
from make_tiny_clip import make_tiny_clip  # scripts/make_tiny_clip.py, from this script's folder as warmstart
from make_tiny_pi0 import make_pi0_warm_start, write_tiny_pi0  # scripts/make_tiny_pi0.py, likewise
from warmstart import make_warm_start  # scripts/warmstart.py: this script's folder is on sys.path when it runs

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"

# Qwen2's pre-tokenisation pattern: words, single digits, punctuation runs, whitespace.
QWEN_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>",
]  # fmt: skip
# The released chat templates, verbatim: Qwen2-VL's (the tokenizer_config.json of Qwen/Qwen2-VL-*-Instruct, which
# Qwen/Qwen2.5-VL-*-Instruct ship byte for byte: a default system turn "You are a helpful assistant.") and Qwen3-VL's
# (Qwen/Qwen3-VL-*-Instruct: no default system turn, tool calls in the Hermes format). TRL 1.16 keeps the same copies
# for identity comparison (trl/chat_templates/qwen2_5_vl.jinja, qwen3_vl.jinja); tests/mmrl/test_policy.py compares
# the tiny folders' templates with them.
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}{% for message "
    "in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n"
    "{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}{% if content['type'] == 'image' or 'image' in "
    "content or 'image_url' in content %}{% set image_count.value = image_count.value + 1 %}{% if "
    "add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' or 'video' in content %"
    "}{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value "
    "}}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ "
    "content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)

QWEN3_VL_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {%- if messages[0].content is string %}\n"
    "            {{- messages[0].content }}\n"
    "        {%- else %}\n"
    "            {%- for content in messages[0].content %}\n"
    "                {%- if 'text' in content %}\n"
    "                    {{- content.text }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '\\n\\n' }}\n"
    "    {%- endif %}\n"
    '    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are '
    'provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n'
    "    {%- for tool in tools %}\n"
    '        {{- "\\n" }}\n'
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": '
    '<args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n'
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' }}\n"
    "        {%- if messages[0].content is string %}\n"
    "            {{- messages[0].content }}\n"
    "        {%- else %}\n"
    "            {%- for content in messages[0].content %}\n"
    "                {%- if 'text' in content %}\n"
    "                    {{- content.text }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set image_count = namespace(value=0) %}\n"
    "{%- set video_count = namespace(value=0) %}\n"
    "{%- for message in messages %}\n"
    '    {%- if message.role == "user" %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
    "        {%- if message.content is string %}\n"
    "            {{- message.content }}\n"
    "        {%- else %}\n"
    "            {%- for content in message.content %}\n"
    "                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}\n"
    "                    {%- set image_count.value = image_count.value + 1 %}\n"
    "                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}\n"
    "                    <|vision_start|><|image_pad|><|vision_end|>\n"
    "                {%- elif content.type == 'video' or 'video' in content %}\n"
    "                    {%- set video_count.value = video_count.value + 1 %}\n"
    "                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}\n"
    "                    <|vision_start|><|video_pad|><|vision_end|>\n"
    "                {%- elif 'text' in content %}\n"
    "                    {{- content.text }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
    "        {%- if message.content is string %}\n"
    "            {{- message.content }}\n"
    "        {%- else %}\n"
    "            {%- for content_item in message.content %}\n"
    "                {%- if 'text' in content_item %}\n"
    "                    {{- content_item.text }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and message.content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    '                {{- \'<tool_call>\\n{"name": "\' }}\n'
    "                {{- tool_call.name }}\n"
    '                {{- \'", "arguments": \' }}\n'
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}\n'
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {%- if message.content is string %}\n"
    "            {{- message.content }}\n"
    "        {%- else %}\n"
    "            {%- for content in message.content %}\n"
    "                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}\n"
    "                    {%- set image_count.value = image_count.value + 1 %}\n"
    "                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}\n"
    "                    <|vision_start|><|image_pad|><|vision_end|>\n"
    "                {%- elif content.type == 'video' or 'video' in content %}\n"
    "                    {%- set video_count.value = video_count.value + 1 %}\n"
    "                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}\n"
    "                    <|vision_start|><|video_pad|><|vision_end|>\n"
    "                {%- elif 'text' in content %}\n"
    "                    {{- content.text }}\n"
    "                {%- endif %}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)
# Each tiny Qwen-VL folder's chat template (its chat_template.jinja, which `mmrl.policy.vlm.tiny.tiny_processor` reads
# with assets/tokenizer); assets/tokenizer itself carries Qwen2-VL's.
CHAT_TEMPLATES = {"qwen2_vl": QWEN2_VL_TEMPLATE, "qwen2_5_vl": QWEN2_VL_TEMPLATE, "qwen3_vl": QWEN3_VL_TEMPLATE}
VOCAB_SIZE = 2048
COLOURS = ["red", "green", "blue", "yellow", "orange", "purple", "black", "white", "gray", "pink"]
KINDS = ["circle", "square", "triangle", "diamond", "star", "rectangle", "button", "icon", "line", "arrow"]


def task_corpus(rng: random.Random) -> list[str]:
    """Phrases our tasks use, so they tokenise compactly (a real tokenizer has seen them too)."""
    lines = []
    for _ in range(3000):
        c, k = rng.choice(COLOURS), rng.choice(KINDS)
        box = [rng.randrange(0, 1000) for _ in range(4)]
        lines.append(f"Find the {c} {k}. Answer as <answer>[x1,y1,x2,y2]</answer>.")
        lines.append(f"<think>The {c} {k} is here.</think><answer>[{box[0]},{box[1]},{box[2]},{box[3]}]</answer>")
        lines.append(f'{{"bbox_2d": [{box[0]}, {box[1]}, {box[2]}, {box[3]}], "label": "{c} {k}"}}')
        lines.append(f'click({box[0]}, {box[1]}) type("{c}") scroll(down) press(enter) <svg width="{box[2]}">')
    return lines


def train_bpe(special: list[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE (Qwen's split) on Python's help texts and our tasks' phrases, `special` first (small ids).
    scripts/make_family_assets.py trains the other families' tokenizers with it too."""
    import pydoc_data.topics

    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)] + task_corpus(rng)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=special,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    return tok


def build_tokenizer(out: Path) -> None:
    from transformers import Qwen2TokenizerFast

    tok = train_bpe(SPECIAL_TOKENS)
    hf = Qwen2TokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
        chat_template=QWEN2_VL_TEMPLATE,
        model_max_length=4096,
    )
    shutil.rmtree(out, ignore_errors=True)
    hf.save_pretrained(out)


def tiny_configs(tok) -> dict[str, tuple[dict, dict]]:
    """(model config, image processor config) for each tiny architecture."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    common = dict(
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    text = dict(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True,
    )
    # mrope_section splits head_dim/2 = 16 rotary frequencies over (time, height, width).
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]}
    image_14 = {"patch_size": 14, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 56 * 56}
    return {
        "qwen2_vl": (
            dict(
                model_type="qwen2_vl",
                text_config=dict(text, rope_parameters=rope),
                vision_config=dict(
                    depth=2, embed_dim=64, hidden_size=128, num_heads=4, mlp_ratio=2, patch_size=14,
                    spatial_merge_size=2, temporal_patch_size=2,
                ),
                **common,
            ),
            dict(image_14, max_pixels=448 * 448),
        ),
        "qwen2_5_vl": (
            dict(
                model_type="qwen2_5_vl",
                text_config=dict(text, rope_parameters=rope),
                vision_config=dict(
                    depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=14, spatial_merge_size=2,
                    temporal_patch_size=2, window_size=56, out_hidden_size=128, fullatt_block_indexes=[1],
                ),
                **common,
            ),
            dict(image_14, max_pixels=448 * 448),
        ),
        "qwen3_vl": (
            dict(
                model_type="qwen3_vl",
                text_config=dict(
                    text, head_dim=32,
                    rope_parameters={**rope, "mrope_section": [6, 5, 5], "mrope_interleaved": True},
                ),
                vision_config=dict(
                    depth=2, hidden_size=64, intermediate_size=128, num_heads=4, patch_size=16, spatial_merge_size=2,
                    temporal_patch_size=2, out_hidden_size=128, num_position_embeddings=64,
                    deepstack_visual_indexes=[1],
                ),
                **common,
            ),
            {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 64 * 64, "max_pixels": 512 * 512},
        ),
    }  # fmt: skip


def build_tiny_configs(out_root: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = AutoTokenizer.from_pretrained(ASSETS / "tokenizer")
    for arch, (model_cfg, image_cfg) in tiny_configs(tok).items():
        out = out_root / arch
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        model_type = model_cfg.pop("model_type")
        AutoConfig.for_model(model_type, **model_cfg).save_pretrained(out)
        Qwen2VLImageProcessorPil(**image_cfg).save_pretrained(out)
        (out / "chat_template.jinja").write_text(CHAT_TEMPLATES[arch])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-warm", action="store_true", help="skip the warm-start checkpoint")
    parser.add_argument("--no-clip", action="store_true", help="skip the reach env's tiny CLIP")
    parser.add_argument("--no-base", action="store_true", help="skip the shared multi-task base (qwen3_vl_base)")
    parser.add_argument("--no-pi0", action="store_true", help="skip the tiny π0 and its warm start")
    args = parser.parse_args()
    build_tokenizer(ASSETS / "tokenizer")
    build_tiny_configs(ASSETS / "tiny_models")
    print(f"wrote {ASSETS / 'tokenizer'} and tiny configs for qwen2_vl, qwen2_5_vl, qwen3_vl")
    if not args.no_warm:
        # The settings of the committed checkpoint (see scripts/warmstart.py): 4 language layers; 600 single-shape
        # steps, then distractors up to step 1750, exact boxes; then 150 steps imitating a sloppy demonstrator whose
        # boxes are padded by 40% of their size on every side. About 12 minutes on one thread.
        make_warm_start(
            ASSETS / "tiny_models" / "qwen3_vl_warm_start",
            text_layers=4,
            single_shape_steps=600,
            exact_steps=1750,
            sloppy_steps=150,
            demo_margin=0.4,
        )
    if not args.no_base:
        # The shared multi-task base, from the warm start just written (or the committed one with --no-warm); about
        # 19 minutes on one thread.
        make_tiny_base(ASSETS / "tiny_models" / "qwen3_vl_base")
    if not args.no_clip:
        make_tiny_clip(ASSETS / "tiny_models" / "clip_reach")
    if not args.no_pi0:
        # The tiny π0's config, then its perception warm start (3000 probe steps, about 3 minutes on one thread).
        write_tiny_pi0()
        make_pi0_warm_start(ASSETS / "tiny_models" / "pi0_warm_start")


if __name__ == "__main__":
    main()
