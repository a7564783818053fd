"""The three things a policy needs from a Hugging Face processor: tokenizer, image processor, chat template.

`AutoProcessor.from_pretrained` builds a Qwen-VL processor only with a video processor, and the real ones need
torchvision, which CPU installs lack. We take the tokenizer (with the model's chat template) and the image processor
and do the one piece of processor logic a policy needs ourselves: each image placeholder the chat template writes
becomes the text the family's processor writes for that image (`mmrl.families`: `<|image_pad|>` x N for
Qwen-VL, Gemma 3's `<start_of_image>` + soft tokens, Idefics3's tiles). The image-token count of every prompt is then
checked against the features its images give, before any forward pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer

from sim.errors import InputError

from ...families import Family, Vision, family_for


def user_content(instruction: str, num_images: int, template: str) -> list[dict]:
    """A user turn's chat content: the template's text with the instruction, and `num_images` images at `{image}`
    (first, without an `{image}` mark)."""
    if "{image}" in template:
        before, after = template.split("{image}", 1)
    else:
        before, after = "", template
    content = [{"type": "text", "text": before.format(instruction=instruction)}] if before else []
    content += [{"type": "image"}] * num_images
    if after:
        content.append({"type": "text", "text": after.format(instruction=instruction)})
    return content


def check_image_tokens(input_ids: torch.Tensor, image_token_id: int, features: torch.Tensor, per_row) -> None:
    """Refuse prompts whose image placeholders do not match their images' features (before any forward pass).

    Args:
        input_ids: `[R, P]` prompts (or whole sequences).
        image_token_id: the placeholder the vision features replace.
        features: `[I]` feature vectors each image gives, row by row.
        per_row: images of each row, an int or `[R]` long.

    Raises:
        ValueError: naming the first row that differs, its images, and both counts.
    """
    rows = input_ids.shape[0]
    counts = per_row.tolist() if isinstance(per_row, torch.Tensor) else [int(per_row)] * rows
    if sum(counts) != len(features):
        raise ValueError(f"{len(features)} images for rows that hold {sum(counts)}")
    held = (input_ids == image_token_id).sum(-1).tolist()  # [R]
    features = features.tolist()
    first = 0
    for r in range(rows):
        need = features[first : first + counts[r]]
        if held[r] != sum(need):
            names = ", ".join(f"image {first + k}: {n}" for k, n in enumerate(need)) or "no images"
            raise ValueError(
                f"prompt row {r} holds {held[r]} image tokens (id {image_token_id}) but its images give {sum(need)} "
                f"features ({names}); the image placeholders and the images do not match"
            )
        first += counts[r]


class VisionTextProcessor:
    """Chat template + tokenizer + image processor of one model family.

    Args:
        tokenizer: a fast tokenizer carrying the model's chat template and the family's image token.
        image_processor: the model's image processor (PIL or fast backend).
        family: the model family (`mmrl.families`), or its `model_type`.
        settings: the processor's own numbers (`processor_config.json`: Gemma 3's `image_seq_length`, Idefics3's
            `image_seq_len`).
    """

    def __init__(self, tokenizer, image_processor, family: Family | str = "qwen2_vl", settings: dict | None = None):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.family = family_for(family) if isinstance(family, str) else family
        self.merge_size = int(getattr(image_processor, "merge_size", 2))
        self.settings = {"merge_size": self.merge_size, **(settings or {})}
        self.image_token = self.family.image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
        if self.image_token_id is None or self.image_token_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {self.image_token} token, the image token of {self.family.name}")
        self._answers_as_text: bool | None = None  # how the template takes an earlier answer (`assistant_message`)
        self.system_prompt = ""  # model.system_prompt: a system turn before every prompt (`chat`)
        # Left padding: generation appends to the right end of every row.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            raise ValueError("the tokenizer has no pad token; set one before building a policy")

    @classmethod
    def from_pretrained(cls, path: str | Path, family: str | None = None) -> VisionTextProcessor:
        """The processor of a folder laid out as the hub's (tokenizer files with the chat template, the image
        processor's `preprocessor_config.json`, `processor_config.json` where the family has one); the family is
        config.json's `model_type` unless given."""
        if family is None and (Path(path) / "config.json").is_file():
            family = json.loads((Path(path) / "config.json").read_text())["model_type"]
        elif family is None:  # a hub id, where a hub is reachable
            from transformers import AutoConfig

            family = AutoConfig.from_pretrained(str(path)).model_type
        family_for(family)  # before anything else loads: a family this transformers lacks is named
        path = Path(path)
        settings = {}
        if (path / "processor_config.json").is_file():
            settings = json.loads((path / "processor_config.json").read_text())
        tokenizer = AutoTokenizer.from_pretrained(path)
        if tokenizer.chat_template is None and (path / "chat_template.json").is_file():
            # Some checkpoints keep the template only with the processor (chat_template.json), not the tokenizer.
            tokenizer.chat_template = json.loads((path / "chat_template.json").read_text())["chat_template"]
        if tokenizer.chat_template is None and family_for(family).prompt is None:
            raise ValueError(
                f"{path} has no chat template (chat_template.jinja, chat_template.json or the tokenizer's)"
            )
        image_processor = AutoImageProcessor.from_pretrained(path)
        return cls(tokenizer, image_processor, family, settings)

    def set_pixel_range(self, min_pixels: int = 0, max_pixels: int = 0) -> None:
        """Bound each image's resized area in pixels, as qwen-vl-utils' `min_pixels`/`max_pixels` do (0 keeps the
        processor's own bound). The image is resized, aspect ratio kept, to a multiple of the patch grid inside the
        range, so the number of image tokens follows: fewer for a small `max_pixels`, more for a large `min_pixels`."""
        if (min_pixels or max_pixels) and not self.family.pixel_bounds:
            raise ValueError(
                f"model.min_pixels / model.max_pixels bound a Qwen-VL image's area; a {self.family.name} model's "
                "processor resizes to its own fixed sizes (leave them 0)"
            )
        if min_pixels < 0 or max_pixels < 0 or (min_pixels and max_pixels and min_pixels > max_pixels):
            raise ValueError(
                f"need 0 <= min_pixels <= max_pixels (0: the processor's own), got {min_pixels}, {max_pixels}"
            )
        size = dict(self.image_processor.size)
        if min_pixels:
            size["shortest_edge"] = (
                min_pixels  # transformers' Qwen-VL processors keep the pixel bounds under these keys
            )
        if max_pixels:
            size["longest_edge"] = max_pixels
        self.image_processor.size = {k: v for k, v in size.items() if v is not None}

    def save_pretrained(self, path: str | Path) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)
        extra = {k: v for k, v in self.settings.items() if k != "merge_size"}
        if extra:
            (Path(path) / "processor_config.json").write_text(json.dumps(extra, indent=2, sort_keys=True) + "\n")

    def vision(self, images: list[Image.Image], per_row: list[int] | None = None) -> Vision:
        """The images in the generic layout (`mmrl.families.Vision`), with each one's placeholder text;
        `per_row` the images of each prompt in order (None: one prompt holds them all)."""
        return self.family.vision(self.image_processor, images, self.settings, per_row)

    def features(self, units: torch.Tensor, per_image: dict[str, torch.Tensor]) -> torch.Tensor:
        """`[I]` the feature vectors (image tokens) of images stored as `units` / `per_image` (a `Rollout`'s)."""
        return self.family.features(units, per_image, self.settings, self.image_processor)

    def model_inputs(
        self, pixel_values: torch.Tensor, per_image: dict[str, torch.Tensor], per_unit: dict[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The vision keyword arguments of the model's forward, from the generic layout."""
        if self.family.forward_inputs is not None:
            per_image = self.family.forward_inputs(per_image)
        if self.family.batched_pixels:  # [1, U, ...]: one sample holding every tile; the model keeps their order
            pixel_values = pixel_values.unsqueeze(0)
            per_unit = {k: v.unsqueeze(0) for k, v in per_unit.items()}
        return {"pixel_values": pixel_values, **per_image, **per_unit}

    def expand(self, text: str, image_texts) -> str:
        """`text` with each image placeholder of the chat template replaced by the next of `image_texts`."""
        parts = text.split(self.family.template_image)
        out = parts[0]
        for part in parts[1:]:
            image_text = next(image_texts, None)
            if image_text is None:
                raise ValueError("more image placeholders than images")
            out += image_text + part
        return out

    def chat(self, messages: list[dict], **kwargs) -> str:
        """The chat template's text of `messages`, after a system turn holding `system_prompt` where one is set (the
        template renders it its own way: Qwen's `<|im_start|>system`, Gemma 3's prefix to the first user turn)."""
        if self.system_prompt:
            messages = [{"role": "system", "content": [{"type": "text", "text": self.system_prompt}]}, *messages]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    def prompt_text(self, instruction: str, num_images: int = 1, template: str = "{instruction}") -> str:
        """The chat-formatted prompt for one user turn.

        `template` places the instruction (`{instruction}`) and, optionally, the images (`{image}`); without an
        `{image}` mark the images come first, as in Qwen-VL's own examples.
        """
        content = user_content(instruction, num_images, template)
        if self.family.prompt is not None:  # a family whose processor writes the prompt (PaliGemma)
            return self.family.prompt(self.tokenizer, content)
        messages = [{"role": "user", "content": content}]
        return self.chat(messages, add_generation_prompt=True)

    def conversation_ids(
        self,
        turns: list[tuple[str, int, list[int]]],
        instruction: str,
        num_images: int,
        image_texts: list[str],
        template: str = "{instruction}",
        eos_token_ids: tuple[int, ...] = (),
    ) -> list[int]:
        """The token ids of a chat whose earlier turns are spliced in as the exact tokens sampled then.

        Args:
            turns: earlier turns, oldest first: (instruction, number of images, the answer's sampled token ids).
            instruction: the current turn's instruction (with `num_images` images); the prompt ends with the
                generation prompt for its answer.
            image_texts: the placeholder text of every image of the chat, in order (`Vision.texts`).
            eos_token_ids: an answer that ends with one of these is not closed a second time by the template.

        The chat template renders each answer as a marker; the text between markers is tokenised on its own (chat
        templates close and open turns with special tokens, so no BPE merge crosses a marker), and each marker
        becomes the answer's ids unchanged: token in, token out. Where the template opens an earlier answer with
        other text than its generation prompt (SmolVLM: "Assistant: " in the history, "Assistant:" to generate;
        Qwen3.5: no `<think>\n\n</think>\n\n` in the history), the answer follows the generation prompt, which is
        what the model saw when it sampled those tokens.
        """
        if self.family.prompt is not None:
            raise ValueError(
                f"a {self.family.name} model has no chat template (its processor writes one prefix per prompt, and it "
                "answers once): it cannot hold a conversation; set model.history_turns to 0"
            )
        opened, generation_prompt = self._answer_openings()
        marks = [f"\x00mmrl-answer-{k}\x00" for k in range(len(turns))]
        messages: list[dict] = []
        for (said, images, _), mark in zip(turns, marks):
            messages.append({"role": "user", "content": user_content(said, images, template)})
            messages.append(self.assistant_message(mark))
        messages.append({"role": "user", "content": user_content(instruction, num_images, template)})
        text = self.chat(messages, add_generation_prompt=True)
        counts = iter(image_texts)
        ids: list[int] = []
        rest = text
        for k in range(len(turns) + 1):
            answer = turns[k][2] if k < len(turns) else None
            if answer is None:
                piece, rest = rest, ""
            else:
                if marks[k] not in rest:
                    raise ValueError("the chat template dropped an earlier answer; it cannot hold a conversation")
                piece, rest = rest.split(marks[k], 1)
                if opened != generation_prompt and piece.endswith(opened):
                    piece = piece[: len(piece) - len(opened)] + generation_prompt
            piece = self.expand(piece, counts)
            piece_ids = self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            if ids and piece_ids and ids[-1] in eos_token_ids and piece_ids[0] == ids[-1]:
                piece_ids = piece_ids[1:]  # the sampled answer closed its turn already
            ids += piece_ids
            if answer is not None:
                ids += list(answer)
        if next(counts, None) is not None:
            raise ValueError("more images than image placeholders in the conversation")
        return ids

    def assistant_message(self, text: str) -> dict:
        """An earlier answer as a chat message in the form the template renders: a list of content parts, or the
        plain string where the template prints an assistant's content as it is (GLM-4.1V's `{{ msg.content }}`
        would write a list's Python repr)."""
        if self._answers_as_text is None:
            probe = "\x00mmrl-probe\x00"
            user = {"role": "user", "content": [{"type": "text", "text": "q"}]}
            parts = {"role": "assistant", "content": [{"type": "text", "text": probe}]}
            self._answers_as_text = probe not in self.tokenizer.apply_chat_template([user, parts], tokenize=False)
        return {"role": "assistant", "content": text if self._answers_as_text else [{"type": "text", "text": text}]}

    def _answer_openings(self) -> tuple[str, str]:
        """(the text the chat template writes before an earlier answer, the text of its generation prompt)."""
        render = self.tokenizer.apply_chat_template
        user = [{"role": "user", "content": [{"type": "text", "text": "q"}]}]
        mark = "\x00mmrl-probe\x00"
        plain = render(user, tokenize=False)
        generate = render(user, add_generation_prompt=True, tokenize=False)
        # The answer in context, a user turn after it: templates render earlier turns differently from the last one
        # (Qwen3.5 drops the empty <think></think> block its generation prompt holds from answers before the last
        # user turn).
        answer = self.assistant_message(mark)
        answered = render([*user, answer, *user], tokenize=False)
        if not (generate.startswith(plain) and answered.startswith(plain) and mark in answered):
            return "", ""  # a template that renders turns differently in context: nothing to reconcile
        return answered[len(plain) : answered.index(mark)], generate[len(plain) :]

    def encode(self, texts: list[str], images: list[Image.Image]) -> tuple[dict[str, torch.Tensor], Vision]:
        """Tokenise prompts that hold the chat template's image placeholders, one per image, left padded.

        Returns:
            `input_ids` [B, P] and `attention_mask` [B, P], and the images (`Vision`, images in prompt order).

        Raises:
            ValueError: placeholders and images differ in number, or a prompt's image tokens do not match its images'
                features (naming the row, the images and both counts).
        """
        placeholders = [text.count(self.family.template_image) for text in texts]
        if sum(placeholders) != len(images):
            raise ValueError(f"the prompts hold {sum(placeholders)} image placeholders for {len(images)} images")
        vision = self.vision(images, placeholders)
        image_texts = iter(vision.texts)
        expanded = [self.expand(text, image_texts) for text in texts]
        enc = self.tokenizer(expanded, return_tensors="pt", padding=True, add_special_tokens=False)
        check_image_tokens(enc["input_ids"], self.image_token_id, vision.tokens, torch.tensor(placeholders))
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}, vision

    def __call__(self, texts: list[str], images: list[Image.Image]) -> dict[str, torch.Tensor]:
        """`encode`'s token ids and mask with the model's vision inputs (`model_inputs`), ready for its forward."""
        enc, vision = self.encode(texts, images)
        return {**enc, **self.model_inputs(vision.pixel_values, vision.per_image, vision.per_unit)}


WEIGHT_FILES = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_vlm_folder(path: Path) -> None:
    """Refuse a local model folder that cannot load as a VLM, naming what it lacks, before transformers reads it
    (which fails later, or with a misleading error: a folder without tokenizer files gets a default tokenizer that
    lacks the family's image token). A hub id (no folder here) is left to transformers.

    Raises:
        InputError: a `model_type` of no supported family, no weight files, no tokenizer files.
    """
    if not path.is_dir() or not (path / "config.json").is_file():
        return
    try:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (ValueError, AttributeError):
        raise InputError(f"{path / 'config.json'} is not a JSON object") from None
    try:
        family_for(str(model_type))
    except ValueError as error:
        raise InputError(f"{path}: {error}") from None
    if not any(next(path.glob(pattern), None) for pattern in WEIGHT_FILES):
        raise InputError(f"{path} holds config.json but no weights (model.safetensors, or pytorch_model.bin): "
                         "save_pretrained writes both")  # fmt: skip
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise InputError(f"{path} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}): copy them from the "
                         "model it was trained from")  # fmt: skip
