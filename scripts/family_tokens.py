"""What each tiny family folder's tokenizer carries (scripts/make_family_assets.py builds the folders): the released
special tokens' names and chat templates, each with where it was copied from, and the READMEs that say so."""

from __future__ import annotations

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


# google/gemma-4-E2B-it's special tokens that the Gemma 4 prompt-formatting guide (ai.google.dev/gemma/docs/core/
# prompt-formatting-gemma4) and transformers' Gemma4Processor name: turns, image and audio wrappers and placeholders,
# the video placeholder, tool and reasoning tokens, the string delimiter (ids here are this tokenizer's own).
GEMMA4_SPECIAL = [
    "<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "<|image>", "<image|>", "<|image|>", "<|audio>",
    "<audio|>", "<|audio|>", "<|video|>", "<|tool>", "<tool|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
    "<tool_response|>", '<|"|>', "<|think|>", "<|channel>", "<channel|>",
]  # fmt: skip

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

GEMMA4_README = (
    """# Tiny Gemma 4

"""
    + BUILT.format(fn="build_gemma4", name="gemma4")
    + """Chat template (chat_template.jinja): google/gemma-4-E2B-it's at revision 8995379 (the latest TRL 1.16 records),
as TRL 1.16 keeps it for identity comparison (trl/chat_templates/gemma4_v5.jinja). The revision the model was released
with (4742fe8, TRL's gemma4_v2.jinja) wrote `\\n\\n<|image|>\\n\\n` for an image and a system message's content list
as Python text; later revisions write `<|image|>` alone. Special tokens: the names of the Gemma 4 prompt-formatting
guide and of transformers' `Gemma4Processor` (not the release's full list). EOS tokens as its generation config:
`<eos>`, `<turn|>`, `<|tool_response>`. Image processor: transformers' `Gemma4ImageProcessorPil` with the smallest
budget it takes (70 soft tokens) on 4 px patches, so an image is at most 630 patches (96 x 96 px for a square one,
64 soft tokens).
"""
)


def trl_template(name: str) -> str:
    """A released chat template as TRL ships it (trl/chat_templates/<name>.jinja, the copies of the released ones that
    TRL compares tokenizers' templates against): Qwen3.5-2B's (`qwen3_5_nothink`: thinking off by default) and
    google/gemma-4-E2B-it's at revision 8995379 (`gemma4_v5`). TRL is in the `bench` extra."""
    from importlib.resources import files

    return (files("trl") / "chat_templates" / f"{name}.jinja").read_text()
