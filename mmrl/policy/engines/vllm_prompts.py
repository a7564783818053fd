"""What the vllm backend hands vLLM and takes back: a family's prompts, its weights' names and what it refuses; the
sampling parameters, the completions, the weights with their version.

Tested on vLLM's CPU build (tests/vllm/test_vllm_families.py) for Idefics3 (SmolVLM v1), SmolVLM2, Qwen3.5 (bfloat16),
InternVL, LLaVA-OneVision and GLM-4.1V, and for Gemma 3 and PaliGemma with their CPU refusal lifted against a causal
training forward; the Qwen-VL families in tests/vllm/test_vllm_backend.py.

**Prompts.** The training prompt's own token ids, each image folded back to what vLLM expands.

vLLM takes a prompt as token ids plus its images, and its processor for the family expands each image in the ids
again, as the Hugging Face processor does (`vllm.multimodal.processing`: a `PromptReplacement` of the chat
template's image placeholder, or a `PromptInsertion` at the prompt's start). The training forward reads the ids
*after* that expansion (`VLMPolicy.encode`, `encode_conversations`). So each row's ids are sent with every image's
text (`Vision.texts`: Qwen's run of `<|image_pad|>`, Gemma 3's `\\n\\n<start_of_image>` + soft tokens +
`<end_of_image>\\n\\n`, Idefics3's tiles with their row/column tags, InternVL's `<img>...</img>`) folded back to the
chat template's placeholder (`Family.template_image`); nothing else is re-tokenised, so an earlier turn's sampled
tokens reach vLLM as they were sampled. The backend checks on every call that the ids vLLM ran on equal the
training prompt's.

Two family facts enter (`Family.vllm`):

* **Merged margins.** Where an image's text starts or ends with whitespace (Gemma 3's `\\n\\n`), the tokenizer
  merges it with the newlines next to it (Gemma's vocabulary holds runs of newlines as single tokens: `"user\\n"` +
  `"\\n\\n"` is one `\\n\\n\\n` token), and vLLM's Gemma 3 processor merges them again after expanding
  (`Gemma3MultiModalProcessor._apply_token_matches`). The margin is taken out of the neighbouring token (`\\n\\n\\n`
  becomes `\\n`), so vLLM's merge gives back the training ids.
* **Inserted images.** PaliGemma's vLLM processor does not replace a placeholder: it inserts each image's tokens and
  a `<bos>` at the prompt's start. Its rows go with the images and that `<bos>` taken out (`VLLMFacts.image` "",
  `after_images` "<bos>").

**Weights** go to vLLM under the names the family's checkpoints on the hub use (`checkpoint_named_weights`:
transformers' own reversion of its load-time renaming), with a tied output head named too (vLLM may build it
untied).

**Refusals.** `unsupported_reason` says why vLLM cannot sample for a model here, from the family's `VLLMFacts`: its
processor's vocabulary or Python needs, its image limit, and on vLLM's CPU build its kernels' dtypes and sizes, or
an attention pattern the CPU build lacks (Gemma 3's and PaliGemma's bidirectional attention); a family whose vLLM
path has not been checked (Gemma 4) is refused everywhere. The backend raises it before an engine starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from sim.base import Observation

from ...families import Family
from ...runtime import distributed
from ...types import Completions, Sampling
from ..lora import merged_named_weights, plain_model
from ..tokens import GenerationTarget
from ..vision import to_pil

BANNED_LOGIT_BIAS = -100.0  # vLLM's logit_bias for tokens never to sample (the OpenAI API's floor)


def _tokens(tokenizer, text: str, cache: dict[str, list[int]]) -> list[int]:
    if text not in cache:
        cache[text] = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    return cache[text]


def _find(ids: list[int], part: list[int], start: int) -> int:
    """The first index >= `start` where `part` occurs in `ids`, or -1."""
    first, n = part[0], len(part)
    for k in range(start, len(ids) - n + 1):
        if ids[k] == first and ids[k : k + n] == part:
            return k
    return -1


def _without_margin(tokenizer, token: int, margin: str, at_end: bool, cache: dict[str, list[int]]) -> list[int]:
    """The ids of `token`'s text with `margin` taken off its end (or start), or None where it does not have it."""
    text = tokenizer.decode([token])
    if not (text.endswith(margin) if at_end else text.startswith(margin)):
        return None
    rest = text[: len(text) - len(margin)] if at_end else text[len(margin) :]
    return _tokens(tokenizer, rest, cache)


def fold_images(
    ids: Sequence[int],
    image_texts: Sequence[str],
    family: Family,
    tokenizer,
    cache: dict[str, list[int]] | None = None,
) -> list[int]:
    """One prompt's ids as vLLM takes them: each image's text (in order) folded back to the family's placeholder.

    Args:
        ids: the prompt's ids as the training forward reads them (unpadded), every image expanded.
        image_texts: the text each of the prompt's images was expanded to (`Vision.texts`), in order.
        family: the model family (its `template_image` and `vllm` facts).
        tokenizer: the policy's tokenizer (only the image texts and their margins are tokenised).
        cache: text -> ids, shared across calls.

    Raises:
        ValueError: an image's text is not where the ids should hold it (the prompt and its images disagree).

    Returns:
        The ids with each image's tokens replaced by the one placeholder vLLM's processor expands (nothing, for a
        family whose vLLM processor inserts the images itself).
    """
    cache = {} if cache is None else cache
    out: list[int] = []
    rest = list(ids)
    facts = family.vllm
    placeholder = _tokens(tokenizer, family.template_image if facts.image is None else facts.image, cache)
    for i, text in enumerate(image_texts):
        core_text = text.strip()
        lead, trail = text[: len(text) - len(text.lstrip())], text[len(text.rstrip()) :]
        core = _tokens(tokenizer, core_text, cache)
        k = _find(rest, core, 0)
        if not core or k < 0:
            raise ValueError(f"image {i}'s tokens ({len(core)}) are not in the prompt's ids: prompt and images differ")
        before, rest = rest[:k], rest[k + len(core) :]
        if lead and before:  # a margin merged into the token before (Gemma 3: "user\n" + "\n\n" is one token)
            unmerged = _without_margin(tokenizer, before[-1], lead, True, cache)
            if unmerged is not None:
                before = before[:-1] + unmerged
        if trail and rest:
            unmerged = _without_margin(tokenizer, rest[0], trail, False, cache)
            if unmerged is not None:
                rest = unmerged + rest[1:]
        out += before + placeholder
    if facts.after_images and image_texts:  # inserted by vLLM with the images (PaliGemma's <bos>)
        after = _tokens(tokenizer, facts.after_images, cache)
        if rest[: len(after)] == after:
            rest = rest[len(after) :]
    return out + rest


def vllm_requests(
    policy: GenerationTarget, prompts: Observation, inputs: dict[str, torch.Tensor]
) -> list[dict[str, Any]]:
    """vLLM token prompts for the rows of `inputs`: the ids the training forward reads with each image folded back
    (`fold_images`, nothing else re-tokenised) and the row's images in order (`inputs.images` where the encoder
    left them, as a conversation's earlier turns' images followed by the current views; else each world's views of
    `prompts`).

    The images' texts are those `VLMPolicy.encode` expanded them to (`inputs.vision.texts`); inputs that lost them
    (a plain dict, as the engine process receives them) have them computed again from the images.
    """
    images = getattr(inputs, "images", None)
    if images is None:  # each world's views as `VLMPolicy.encode` shows them (at their own sizes where it can)
        shown = prompts.view_images() if hasattr(prompts, "view_images") else prompts.views
        images = [[to_pil(v) for v in row] for row in shown]  # [N][V]
    input_ids, mask = inputs["input_ids"].cpu(), inputs["attention_mask"].cpu()
    if len(images) != len(input_ids):
        raise ValueError(f"{len(input_ids)} prompts but images for {len(images)}")
    processor = policy.processor
    counts = [len(row) for row in images]
    vision = getattr(inputs, "vision", None)
    texts = list(vision.texts) if vision is not None else []
    if len(texts) != sum(counts):
        flat = [image for row in images for image in row]
        texts = list(processor.vision(flat, counts).texts) if flat else []
    requests, first, cache = [], 0, {}
    for row, (ids, keep, row_images) in enumerate(zip(input_ids.tolist(), mask.tolist(), images)):
        ids = [t for t, m in zip(ids, keep) if m]
        row_texts = texts[first : first + len(row_images)]
        first += len(row_images)
        try:
            ids = fold_images(ids, row_texts, processor.family, processor.tokenizer, cache)
        except ValueError as e:
            raise ValueError(f"prompt {row}: {e}") from e
        request: dict[str, Any] = {"prompt_token_ids": ids}
        if row_images:
            request["multi_modal_data"] = {"image": list(row_images)}
        requests.append(request)
    return requests


def checkpoint_named_weights(model, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """`weights` (named as the plain transformers `model` names its parameters) renamed as its checkpoints on the
    hub name them, which is what vLLM's loaders map (`reload_weights(..., is_checkpoint_format=True)`).

    transformers 5 renames checkpoint keys when it loads a model (`conversion_mapping`: LLaVA-OneVision's
    `vision_tower.vision_model.*` becomes `model.vision_tower.*`) and reverts that when it saves; vLLM's loaders know
    the checkpoint names and, for most families, the new ones too, but not LLaVA-OneVision's vision tower. This
    applies transformers' own reversion (`revert_weight_conversion`, what `save_pretrained` writes), with the
    prefix changes of a model built from a config kept (transformers drops those where it cannot tell whether the
    checkpoint had the prefix; a model here always stands for a hub checkpoint). The tensors are the same objects.
    Where this transformers has no reversion, the names are returned as they are.
    """
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions: its names are the checkpoint's
        return weights
    plain = plain_model(model)
    weights = _with_tied_head(plain, weights)
    had = "_weight_conversions" in plain.__dict__
    if not had:  # built from a config: the full mapping, prefix changes included
        plain._weight_conversions = get_model_conversion_mapping(plain, add_legacy=False) or None
    try:
        renamed = revert_weight_conversion(plain, dict(weights))
    finally:
        if not had:
            del plain._weight_conversions
    return list(renamed.items())


def _with_tied_head(plain, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """`weights` with the output head's weight named too where it is tied to the input embedding (the parameter is
    listed once, as the embedding): vLLM builds the head untied wherever the text config says so, even when the
    model's own config ties it (the tiny InternVL: `tie_word_embeddings` true at the top, false in `text_config`),
    and a head left out of the stream keeps its dummy weights. A vLLM model that ties it skips the name."""
    head, embedding = plain.get_output_embeddings(), plain.get_input_embeddings()
    if head is None or embedding is None or head.weight is not embedding.weight:
        return weights
    names = {module: name for name, module in plain.named_modules()}
    head_name, embedding_name = f"{names[head]}.weight", f"{names[embedding]}.weight"
    tensors = dict(weights)
    if head_name in tensors or embedding_name not in tensors:
        return weights
    return [*weights, (head_name, tensors[embedding_name])]


def unsupported_reason(family: Family, tokenizer, config, dtype: torch.dtype, on_cpu: bool, images: int) -> str | None:
    """Why vLLM cannot sample for a model of `family` here, or None where it can (`Family.vllm`).

    Args:
        family: the model's family.
        tokenizer: its tokenizer (the one the engine folder is saved with).
        config: the model's config.
        dtype: the model's dtype.
        on_cpu: the engine would run on vLLM's CPU build.
        images: the images a prompt would hold (`limit_mm_per_prompt`).
    """
    facts = family.vllm
    if facts.refused:
        return facts.refused
    vocab = tokenizer.get_vocab()
    missing = [entry for entry in facts.vocab if entry not in vocab]
    if missing:
        return (
            f"vLLM's {family.name} processor looks up {', '.join(map(repr, missing))} in the tokenizer's vocabulary, "
            "and this tokenizer has no such entries (the released tokenizers of the family do: a byte-level BPE "
            "writes a newline as 'Ċ')"
        )
    for module in facts.modules:
        if importlib.util.find_spec(module) is None:
            return (
                f"vLLM builds transformers' processor of {family.name}, which needs the Python package {module!r}, "
                f"not installed here (pip install {module})"
            )
    if facts.max_images is not None and images > facts.max_images:
        return (
            f"vLLM's {family.name} takes at most {facts.max_images} image(s) a prompt as the training forward reads "
            f"them, and the engine would need "
            f"{images} (views x (1 + model.history_turns), or max_images_per_prompt)"
        )
    if not on_cpu:
        return None
    if facts.cpu:
        return f"on CPU: {facts.cpu}"
    name = str(dtype).removeprefix("torch.")
    if facts.cpu_dtypes and name not in facts.cpu_dtypes:
        return (
            f"vLLM's CPU build runs {family.name} in {' or '.join(facts.cpu_dtypes)} only, and the model is {name} "
            f"(model.dtype: {facts.cpu_dtypes[0]})"
        )
    text = getattr(config, "text_config", config)
    for key, values in facts.cpu_config:
        value = getattr(text, key, None)
        if value is not None and value not in values:
            return f"vLLM's CPU kernels for {family.name} take {key} in {values}, and the model's is {value}"
    return None


# ---------------------------------------------------------------------------------------------- sampling, completions, weights
def sampling_params_kwargs(
    policy: GenerationTarget, group_size: int, sampling: Sampling, seed: int | None = None
) -> dict:
    """Keyword arguments of `vllm.SamplingParams` equivalent to the `hf` backend's `generate` call.

    Greedy asks for one completion per prompt (the caller repeats it G times); `top_k <= 0` is -1 (off) in vLLM.
    A VLA emits exactly C*D tokens restricted to its action tokens; a text policy stops at its EOS ids and never
    samples a vision placeholder.
    """
    greedy = sampling.temperature <= 0
    kwargs: dict[str, Any] = {
        "n": 1 if greedy else group_size,
        "temperature": 0.0 if greedy else sampling.temperature,
        "top_p": 1.0 if greedy else sampling.top_p,
        "top_k": -1 if greedy or sampling.top_k <= 0 else sampling.top_k,
        "repetition_penalty": 1.0,
        "logprobs": 0,  # the sampled token's log-prob only
        "detokenize": False,  # GenerationTarget decodes the ids itself
        "seed": seed,
    }
    codec = policy.action_codec
    if codec is not None:
        tokens = codec.tokens_per_generation
        kwargs.update(
            max_tokens=tokens, min_tokens=tokens, allowed_token_ids=codec.token_ids.tolist(), ignore_eos=True
        )
    else:
        kwargs.update(max_tokens=sampling.max_new_tokens, stop_token_ids=list(policy.eos_token_ids))
        if policy.suppress_token_ids:
            kwargs["logit_bias"] = {int(t): BANNED_LOGIT_BIAS for t in policy.suppress_token_ids}
    return kwargs


def scheduler_chunks(tokens: Sequence[int], n: int, batch_tokens: int, max_seqs: int) -> list[tuple[list[int], bool]]:
    """Consecutive runs of prompts whose prefill fits one scheduler step, each with whether it can be seeded.

    vLLM's CPU sampler fails a seeded request whose prefill is split across scheduler steps, and one step takes at
    most `batch_tokens` prompt tokens and `max_seqs` sequences (each of a prompt's n samples is a sequence of its
    own). A call is sent as such runs, one after another, each seeded; a prompt that alone does not fit goes alone,
    unseeded.

    >>> scheduler_chunks([30, 30, 30, 80], n=2, batch_tokens=128, max_seqs=16)
    [([0, 1], True), ([2], True), ([3], False)]
    """
    chunks: list[tuple[list[int], bool]] = []
    run, used = [], 0
    for i, t in enumerate(tokens):
        cost = int(t) * n
        if run and (used + cost > batch_tokens or (len(run) + 1) * n > max_seqs):
            chunks.append((run, True))
            run, used = [], 0
        if cost > batch_tokens or n > max_seqs:
            chunks.append(([i], False))
            continue
        run, used = run + [i], used + cost
    if run:
        chunks.append((run, True))
    return chunks


def completions_from_vllm(outputs: Sequence[Any], pad_token_id: int, repeat: int = 1) -> Completions:
    """`Completions` from vLLM's `RequestOutput`s (one per prompt, in prompt order).

    Reads `output.outputs` (the `CompletionOutput`s of a prompt, ordered by `.index`), each with `.token_ids`
    (the sampled ids; a final EOS included) and `.logprobs` (one `{token_id: Logprob(logprob=...)}` dict per
    sampled token, as `SamplingParams(logprobs=0)` returns them).

    Args:
        outputs: B request outputs.
        pad_token_id: fills each row after its last token.
        repeat: each completion is repeated this many times (greedy decoding sampled one per prompt).

    Returns:
        R = B * (completions per prompt) * repeat rows; the mask is True on each row's own tokens.
    """
    rows = [c for request in outputs for c in sorted(request.outputs, key=lambda c: c.index) for _ in range(repeat)]
    if not rows:
        raise ValueError("vLLM returned no completions")
    length = max(max(len(c.token_ids) for c in rows), 1)
    completion_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)  # [R, L]
    logprobs = torch.zeros(len(rows), length)  # [R, L]
    for r, c in enumerate(rows):
        ids = list(c.token_ids)
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise ValueError("vLLM returned no per-token log-probs: SamplingParams(logprobs=0) is required")
        completion_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        logprobs[r, : len(ids)] = torch.tensor([step[t].logprob for step, t in zip(c.logprobs, ids)])
    lengths = torch.tensor([len(c.token_ids) for c in rows])  # [R]
    mask = torch.arange(length).unsqueeze(0) < lengths.unsqueeze(1)  # [R, L]
    return Completions(completion_ids=completion_ids, completion_mask=mask, logprobs=logprobs.masked_fill(~mask, 0.0))


def engine_named_weights(model) -> list[tuple[str, torch.Tensor]]:
    """What a weight push hands vLLM: `model`'s weights with LoRA merged (`merged_named_weights`), detached, under the
    names its hub checkpoints use (`checkpoint_named_weights`, a tied head named too), in a fixed order.

    Every route sends this: the colocated engine's `sync_weights` (and through it the engine process's CPU route,
    whose child syncs from its shared-memory shadow) and the engine process's GPU weight transfer
    (`vllm_engine.weight_source`). The tensors are the model's own, or new ones where a LoRA delta is merged.
    """
    weights = [(name, tensor.detach()) for name, tensor in merged_named_weights(model)]
    return checkpoint_named_weights(model, weights)


def weights_version(model) -> tuple[int, ...]:
    """Version counters of the trainable parameters: they change whenever an optimiser updates them in place. For a
    model FSDP2 shards (torchrun), those of the shards (`distributed.parameter_versions`): the whole parameters
    `full_weights` gathers for generation keep theirs across an update."""
    return distributed.parameter_versions(model)
