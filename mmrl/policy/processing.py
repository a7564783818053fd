"""The three things a policy needs from a Hugging Face processor: tokenizer, image processor, chat template.

`AutoProcessor.from_pretrained` builds a Qwen-VL processor only with a video processor, and the real ones need
torchvision, which CPU installs lack. We try `AutoProcessor` first and otherwise assemble the same pieces from
`AutoTokenizer` and `AutoImageProcessor`; the one piece of processor logic this needs is expanding each image
placeholder into as many tokens as the vision tower produces for that image.
"""

from __future__ import annotations

from pathlib import Path

import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer


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


class VisionTextProcessor:
    """Chat template + tokenizer + image processor for Qwen-family VLMs.

    Args:
        tokenizer: a fast tokenizer carrying the model's chat template and `<|image_pad|>`.
        image_processor: the model's image processor (PIL or fast backend).
        image_token: the placeholder the chat template emits once per image.
    """

    def __init__(self, tokenizer, image_processor, image_token: str = "<|image_pad|>"):
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token = image_token
        self.image_token_id = tokenizer.convert_tokens_to_ids(image_token)
        self.merge_size = int(getattr(image_processor, "merge_size", 2))
        # Left padding: generation appends to the right end of every row.
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            raise ValueError("the tokenizer has no pad token; set one before building a policy")

    @classmethod
    def from_pretrained(cls, path: str | Path) -> VisionTextProcessor:
        path = str(path)
        try:
            from transformers import AutoProcessor

            processor = AutoProcessor.from_pretrained(path)
            return cls(processor.tokenizer, processor.image_processor)
        except (ImportError, OSError, ValueError, TypeError, AttributeError):
            # No torchvision (CPU installs): the video processor cannot be built. Assemble the parts.
            tokenizer = AutoTokenizer.from_pretrained(path)
            image_processor = AutoImageProcessor.from_pretrained(path)
            return cls(tokenizer, image_processor)

    def set_pixel_range(self, min_pixels: int = 0, max_pixels: int = 0) -> None:
        """Bound each image's resized area in pixels, as qwen-vl-utils' `min_pixels`/`max_pixels` do (0 keeps the
        processor's own bound). The image is resized, aspect ratio kept, to a multiple of the patch grid inside the
        range, so the number of image tokens follows: fewer for a small `max_pixels`, more for a large `min_pixels`."""
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

    def prompt_text(self, instruction: str, num_images: int = 1, template: str = "{instruction}") -> str:
        """The chat-formatted prompt for one user turn.

        `template` places the instruction (`{instruction}`) and, optionally, the images (`{image}`); without an
        `{image}` mark the images come first, as in Qwen-VL's own examples.
        """
        messages = [{"role": "user", "content": user_content(instruction, num_images, template)}]
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def conversation_ids(
        self,
        turns: list[tuple[str, int, list[int]]],
        instruction: str,
        num_images: int,
        tokens_per_image: list[int],
        template: str = "{instruction}",
        eos_token_ids: tuple[int, ...] = (),
    ) -> list[int]:
        """The token ids of a chat whose earlier turns are spliced in as the exact tokens sampled then.

        Args:
            turns: earlier turns, oldest first: (instruction, number of images, the answer's sampled token ids).
            instruction: the current turn's instruction (with `num_images` images); the prompt ends with the
                generation prompt for its answer.
            tokens_per_image: the placeholder count of every image of the chat, in order.
            eos_token_ids: an answer that ends with one of these is not closed a second time by the template.

        The chat template renders each answer as a marker; the text between markers is tokenised on its own (chat
        templates close and open turns with special tokens, so no BPE merge crosses a marker), and each marker
        becomes the answer's ids unchanged: token in, token out.
        """
        marks = [f"\x00mmrl-answer-{k}\x00" for k in range(len(turns))]
        messages: list[dict] = []
        for (said, images, _), mark in zip(turns, marks):
            messages.append({"role": "user", "content": user_content(said, images, template)})
            messages.append({"role": "assistant", "content": [{"type": "text", "text": mark}]})
        messages.append({"role": "user", "content": user_content(instruction, num_images, template)})
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        counts = iter(tokens_per_image)
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
            parts = piece.split(self.image_token)
            piece = parts[0] + "".join(self.image_token * next(counts) + part for part in parts[1:])
            piece_ids = self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            if ids and piece_ids and ids[-1] in eos_token_ids and piece_ids[0] == ids[-1]:
                piece_ids = piece_ids[1:]  # the sampled answer closed its turn already
            ids += piece_ids
            if answer is not None:
                ids += list(answer)
        if next(counts, None) is not None:
            raise ValueError("more images than image placeholders in the conversation")
        return ids

    def __call__(self, texts: list[str], images: list[Image.Image]) -> dict[str, torch.Tensor]:
        """Tokenise prompts that hold one image placeholder per image, left padded.

        Returns:
            `input_ids` [B, P], `attention_mask` [B, P], `pixel_values` [sum of patches, C*T*p*p],
            `image_grid_thw` [num_images, 3].
        """
        vision = self.image_processor(images=images, return_tensors="pt")
        grid = vision["image_grid_thw"]  # [num_images, 3]
        tokens_per_image = (grid.prod(-1) // self.merge_size**2).tolist()
        expanded, k = [], 0
        for text in texts:
            parts = text.split(self.image_token)
            out = parts[0]
            for part in parts[1:]:
                out += self.image_token * tokens_per_image[k] + part
                k += 1
            expanded.append(out)
        if k != len(images):
            raise ValueError(f"the prompts hold {k} image placeholders for {len(images)} images")
        enc = self.tokenizer(expanded, return_tensors="pt", padding=True, add_special_tokens=False)
        return {
            "input_ids": enc["input_ids"],
            "attention_mask": enc["attention_mask"],
            "pixel_values": vision["pixel_values"],
            "image_grid_thw": grid,
        }
