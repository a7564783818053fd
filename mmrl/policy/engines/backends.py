"""Generation backends behind `VLMPolicy.generate`: who runs the decoding loop, the same `Rollout` out of each.

`VLMPolicy.generate` encodes the prompts itself (so `Rollout.prompt_ids` and `pixel_values` are always the ones
`VLMPolicy.logprobs` re-scores) and asks its backend for the completions of every prompt:

* `"lean"` (`LeanBackend`, the default): a sampling loop over the model's own forward and its dynamic KV cache,
  without `generate`'s machinery. Each distinct prompt is prefilled once (its image encoded once) and the cache
  repeated G times, where `generate` prefills all B*G rows; the recorded log-probs are the log-softmax the loop
  samples from; and the sampler is exact but cheaper than `torch.multinomial` on CPU (`mmrl.policy.sampling`).
  Tested to give `hf`'s greedy tokens, log-probs equal to `VLMPolicy.logprobs`' rescoring, and the distribution
  of `hf`'s warpers (top-k, top-p, temperature).
* `"hf"` (`HFBackend`): transformers' `generate` with its default dynamic KV cache. The reference.
* `"static"` (`StaticCacheBackend`): the same `generate` with a pre-allocated static KV cache, whose fixed shapes
  let transformers compile the one-token decoding forward (`torch.compile`, CUDA graphs via its default
  `CompileConfig(mode="reduce-overhead")`). On CUDA this removes most of the per-token launch overhead that
  dominates decoding at RL batch sizes. **Compilation is skipped on CPU**, deliberately: transformers' own
  auto-compile criteria leave the CPU out, and compiling even the tiny test models on CPU takes minutes. On CPU
  the backend is therefore the static cache without compilation, which the tests check gives the `hf` tokens and
  log-probs. The compiled path is tested on CUDA (`-m gpu`: `hf`'s tokens in float32 on the tiny models; its speed
  against `hf` is in BENCHMARKS.md; in bfloat16 its greedy tokens may leave `hf`'s at near-ties, from rounding). **Nor is it compiled outside the main thread**
  (pipelined collection, `trainer.max_staleness: 1`, generates in a thread): torch's CUDA graph trees keep
  thread-local state that a Python thread lacks, and the first compiled call there fails with an AssertionError in
  `cudagraph_trees.get_obj` (seen on an H100 with torch 2.11; pytorch/pytorch#123177). There the backend decodes
  with the static cache, uncompiled.
* `"vllm"` (`mmrl.policy.engines.vllm_colocated.VLLMBackend`): a colocated vLLM engine; see that module.

Not used: transformers' continuous batching (`generate_batch`, paged attention). In transformers 5.x it takes
token-id prompts only (`inputs: list[list[int]]`), with no way to pass `pixel_values`, so it cannot serve a VLM
whose prompts hold images; and RL batches are uniform (B prompts x G samples, same max length), where continuous
batching gains little over a static batch anyway.

Sampling-time log-probs are recorded without keeping every step's logits: `output_logits=True` would hold
`[R, L, V]` until the end (64 rows x 512 tokens x 152k vocabulary = 20 GB in float32 for an SVG policy on
Qwen2.5-VL). `_SamplingLogprobs`, the first logits processor, instead keeps one step's `[R, V]` log-softmax and
reads off the sampled token's entry one step later, when the token appears in `input_ids`.
"""

from __future__ import annotations

import inspect
import math
import threading
from typing import Protocol

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from sim.base import Observation

from ...types import Completions, Sampling
from ..lora import plain_model
from ..sampling import filter_top_k_top_p, sample_categorical
from ..tokens import AllowOnly, GenerationTarget, completion_mask_from_ids
from .vllm_colocated import VLLMBackend
from .vllm_process import VLLMProcessBackend

BACKENDS = ("lean", "hf", "static", "vllm", "vllm_process")
STATIC_CACHE_BUCKET = 256  # static KV caches are sized in multiples of this many tokens (one compiled shape each)


class GenerationBackend(Protocol):
    """Samples the completions of `VLMPolicy.generate`.

    `prompts` are the B distinct prompts and `inputs` their encoding by `policy.encode` (`input_ids` `[B, P]` left
    padded, `attention_mask`, the family's vision inputs (`pixel_values`, Qwen's `image_grid_thw`...), and token types
    where the model takes them).
    A backend returns `group_size` completions per prompt, restricted to the action tokens for a VLA
    (`policy.action_codec`), never containing `policy.suppress_token_ids` otherwise, with log-probs under the
    same convention as `VLMPolicy.logprobs`: `softmax(logits / temperature)` (temperature 1 when greedy), over the
    action tokens for a VLA and over the whole vocabulary otherwise.
    """

    name: str

    def sample(
        self,
        policy: GenerationTarget,
        prompts: Observation,
        inputs: dict[str, torch.Tensor],
        group_size: int,
        sampling: Sampling,
    ) -> Completions: ...

    def close(self) -> None:
        """Let go of what the backend holds (an engine, its memory); the next `sample` starts again."""
        ...


def make_backend(name: str, **options) -> GenerationBackend:
    """The backend called `name` (one of `BACKENDS`); `options` go to its constructor (vllm only)."""
    if name == "lean":
        backend: GenerationBackend = LeanBackend()
    elif name == "hf":
        backend = HFBackend()
    elif name == "static":
        backend = StaticCacheBackend()
    elif name == "vllm":
        return VLLMBackend(**options)
    elif name == "vllm_process":  # vLLM in a process of its own (mmrl.policy.engines.vllm_process)
        return VLLMProcessBackend(**options)
    else:
        raise ValueError(f"unknown generation backend {name!r}; choose one of {', '.join(BACKENDS)}")
    if options:
        raise ValueError(f"generation backend {name!r} takes no options, got {sorted(options)}")
    return backend


def forget_compiled_calls(model: torch.nn.Module) -> None:
    """Drop the compiled forward that transformers' `generate` caches on a model (`_compiled_call`, made by
    `get_compiled_call` on a compiled backend's first call) from every module of `model`, a fresh deep copy
    (`VLMPolicy.__deepcopy__` calls it on every copy of a policy).

    `copy.deepcopy` copies functions by reference, so a copy made after the original had compiled its decoding step
    would decode with the ORIGINAL's weights (the compiled callable wraps the original's bound `__call__`): the
    pipelined collector's copy would sample from the weights being updated at that moment, not the snapshot it
    holds, and the copy shipped to rollout workers would carry the original model along.
    """
    for module in model.modules():
        for name in ("_compiled_call", "_last_compile_config"):
            module.__dict__.pop(name, None)


def repeat_cache(cache, rows: int, copies: int) -> None:
    """Repeat each of the `rows` rows of a prefilled cache `copies` times, in place (row b becomes rows
    b*copies .. b*copies+copies-1).

    Attention layers keep keys and values; recurrent layers (Qwen3.5's Gated DeltaNet, transformers'
    `LinearAttentionLayer`) keep a convolution state and a recurrent state per row instead, which
    `batch_repeat_interleave` does not reach (a hybrid layer inherits the attention layer's, which would repeat the
    keys and values only). Such caches are repeated through `reorder_cache`, the beam-search gather every layer type
    implements, with each row's index repeated.
    """
    layers = getattr(cache, "layers", ())
    if any(hasattr(layer, "conv_states") or hasattr(layer, "recurrent_states") for layer in layers):
        cache.reorder_cache(torch.arange(rows).repeat_interleave(copies))
    else:
        cache.batch_repeat_interleave(copies)


class _SamplingLogprobs(LogitsProcessor):
    """The first logits processor of a `generate` call: records the sampled tokens' log-probs, then applies bans.

    Called once per generated token with the raw logits of the next position (no processor runs before it: the
    backend passes no option that makes transformers add one). At step t it stores
    `log_softmax(raw_logits_t[..., allowed] / temperature)`; at step t+1 the token sampled at step t is the last
    column of `input_ids`, and its entry is read off. `finish` reads the last token. Only one `[R, V]` tensor is
    alive at a time.

    After recording, the returned scores ban what may not be sampled: everything but the action tokens of a VLA
    (`AllowOnly`), else the vision placeholders (`suppress`, which transformers' `suppress_tokens` would have done
    before this processor saw the logits, i.e. before recording).

    Args:
        temperature: the sampling temperature (1 for greedy), applied to the recorded log-probs only; the
            temperature warper that follows in transformers' list does the sampling side.
        allowed: `[K]` action token ids of a VLA, or None.
        suppress: token ids never to sample (ignored when `allowed` is given).
        token_index: maps completion ids to columns of the restricted logits (`GenerationTarget.token_index`).
    """

    def __init__(self, temperature: float, allowed: torch.Tensor | None, suppress: list[int], token_index):
        self.temperature = temperature
        self.allowed = allowed
        self.allow_only = AllowOnly(allowed) if allowed is not None else None
        self.suppress = list(suppress)
        self.token_index = token_index
        self._previous: torch.Tensor | None = None  # [R, V'] log-probs of the last step
        self._steps: list[torch.Tensor] = []  # per step [R]

    def _read(self, tokens: torch.Tensor) -> torch.Tensor:
        assert self._previous is not None
        index = self.token_index(tokens).to(self._previous.device)  # [R]
        return self._previous.gather(-1, index.unsqueeze(-1)).squeeze(-1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._previous is not None:
            self._steps.append(self._read(input_ids[:, -1]))
        logits = scores if self.allowed is None else scores[:, self.allowed.to(scores.device)]
        # log_softmax makes a new tensor, so later processors that modify `scores` in place cannot reach it.
        self._previous = torch.log_softmax(logits.float() / self.temperature, dim=-1)  # [R, V']
        if self.allow_only is not None:
            return self.allow_only(input_ids, scores)
        if self.suppress:
            banned = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
            banned[self.suppress] = True
            return scores.masked_fill(banned, float("-inf"))
        return scores

    def finish(self, completion_ids: torch.Tensor) -> torch.Tensor:
        """`[R, L]` log-probs of `completion_ids`, the tokens generated while this processor ran."""
        if self._previous is None:
            raise RuntimeError("the logits processor never ran: nothing was generated")
        steps = [*self._steps, self._read(completion_ids[:, -1])]
        if len(steps) != completion_ids.shape[1]:
            raise RuntimeError(f"recorded {len(steps)} steps for {completion_ids.shape[1]} generated tokens")
        return torch.stack(steps, dim=1)


def _plan(policy: GenerationTarget, group_size: int, sampling: Sampling) -> tuple[bool, int, float, int]:
    """(greedy, copies, temperature, max_new_tokens) of a `sample` call.

    Greedy samples of one prompt are all the same: each prompt is decoded once and its row repeated G times
    (`_finish`); transformers also refuses num_return_sequences > 1 without sampling. The recorded log-probs of a
    greedy draw are at temperature 1. A VLA generates exactly its codec's tokens per generation.
    """
    greedy = sampling.temperature <= 0
    codec = policy.action_codec
    max_new_tokens = codec.tokens_per_generation if codec is not None else sampling.max_new_tokens
    return greedy, 1 if greedy else group_size, 1.0 if greedy else sampling.temperature, max_new_tokens


def _finish(
    policy: GenerationTarget, completion_ids: torch.Tensor, logprobs: torch.Tensor, copies: int, group_size: int
) -> Completions:
    """The `Completions` of `[R', L]` generated ids and their log-probs: masked after EOS (pad ids, 0 log-probs),
    and each row repeated to G rows where one copy per prompt was decoded (greedy)."""
    mask = completion_mask_from_ids(completion_ids, policy.eos_token_ids)
    logprobs = logprobs.masked_fill(~mask, 0.0)
    if policy.pad_token_id is not None:
        completion_ids = completion_ids.masked_fill(~mask, policy.pad_token_id)
    if copies != group_size:
        completion_ids, mask, logprobs = (
            x.repeat_interleave(group_size, dim=0) for x in (completion_ids, mask, logprobs)
        )
    return Completions(completion_ids=completion_ids, completion_mask=mask, logprobs=logprobs)


class HFBackend:
    """transformers' `generate` (dynamic KV cache): the reference backend."""

    name = "hf"

    def close(self) -> None:
        """Nothing to let go of: the loop runs on the policy's own model."""

    def generate_kwargs(self, policy: GenerationTarget, prompt_len: int, max_new_tokens: int) -> dict:
        """Extra `generate` arguments of this backend (none: transformers' defaults)."""
        return {}

    @torch.no_grad()
    def sample(
        self,
        policy: GenerationTarget,
        prompts: Observation,
        inputs: dict[str, torch.Tensor],
        group_size: int,
        sampling: Sampling,
    ) -> Completions:
        greedy, copies, temperature, max_new_tokens = _plan(policy, group_size, sampling)
        codec = policy.action_codec
        recorder = _SamplingLogprobs(
            temperature=temperature,
            allowed=codec.token_ids if codec is not None else None,
            suppress=policy.suppress_token_ids,
            token_index=policy.token_index,
        )
        prompt_len = inputs["input_ids"].shape[1]
        model = policy.model
        was_training = model.training
        model.eval()
        try:
            sequences = model.generate(
                synced_gpus=False,  # under FSDP whole weights are gathered first: no per-token collective
                **inputs,
                do_sample=not greedy,
                temperature=None if greedy else sampling.temperature,
                top_p=None if greedy else sampling.top_p,
                top_k=None if greedy else sampling.top_k,
                # Real checkpoints ship sampling defaults (Qwen2.5-VL: repetition_penalty=1.05) that transformers
                # fills into every unset option; a penalty would make the samples' distribution differ from the
                # recorded one, so it is pinned off.
                repetition_penalty=1.0,
                max_new_tokens=max_new_tokens,
                logits_processor=LogitsProcessorList([recorder]),
                num_return_sequences=copies,
                eos_token_id=policy.eos_token_ids,
                pad_token_id=policy.pad_token_id,
                **self.generate_kwargs(policy, prompt_len, max_new_tokens),
            )
        finally:
            model.train(was_training)
        completion_ids = sequences[:, prompt_len:]  # [R, L]
        return _finish(policy, completion_ids, recorder.finish(completion_ids), copies, group_size)


class StaticCacheBackend(HFBackend):
    """`generate` with a static KV cache, the decoding step compiled by transformers on CUDA (not on CPU).

    The cache length is rounded up to a multiple of `STATIC_CACHE_BUCKET` tokens so that prompts of slightly
    different lengths share one compiled graph; transformers keeps the largest cache length seen so far, so the
    number of recompilations is bounded by the number of buckets (and batch sizes: training and evaluation).
    """

    name = "static"

    def generate_kwargs(self, policy: GenerationTarget, prompt_len: int, max_new_tokens: int) -> dict:
        length = math.ceil((prompt_len + max_new_tokens) / STATIC_CACHE_BUCKET) * STATIC_CACHE_BUCKET
        return {
            "cache_implementation": "static",
            "max_cache_len": length,
            # Explicit, though transformers' auto-compile criteria already exclude the CPU; and never in a thread
            # (CUDA graph trees fail there): see the module docstring.
            "disable_compile": policy.device.type == "cpu"
            or threading.current_thread() is not threading.main_thread(),
        }


class LeanBackend:
    """A sampling loop over the model's forward with a dynamic KV cache: the default backend.

    Per call: one prefill of the B distinct prompts (images encoded once each), the cache repeated to the B*G rows,
    then one forward per new token over the last token only. At each step the loop takes
    `log_softmax(logits[allowed] / temperature)` once, records the sampled token's entry (the log-probs of
    `VLMPolicy.logprobs`), and samples from it after the bans (vision placeholders, or everything but a VLA's action
    tokens; EOS before the model's `generation_config.min_new_tokens`) and top-k/top-p filtering.

    Positions: each new token's rotary position is the model's own multimodal position for text after the prompt,
    `rope_deltas + (real tokens before it)`, the same for the three M-RoPE axes; this is what `VLMPolicy.logprobs`
    gives the same token when it rescores the whole sequence (tested by comparing the two log-probs). A prompt
    without image has no `rope_deltas`; the model then numbers positions from 0 over the padded prompt, and so does
    the loop. The cache keyword is read from the model's signature (`cache` from transformers 5.24 on,
    `past_key_values` before).
    """

    name = "lean"

    def close(self) -> None:
        """Nothing to let go of: the loop runs on the policy's own model."""

    @torch.no_grad()
    def sample(
        self,
        policy: GenerationTarget,
        prompts: Observation,
        inputs: dict[str, torch.Tensor],
        group_size: int,
        sampling: Sampling,
    ) -> Completions:
        greedy, copies, temperature, max_new_tokens = _plan(policy, group_size, sampling)
        codec = policy.action_codec
        model = policy.model
        base = plain_model(model)
        inner = getattr(base, "model", None)
        cache_key = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        device = inputs["input_ids"].device
        allowed = codec.token_ids.to(device) if codec is not None else None
        eos = torch.tensor(policy.eos_token_ids, device=device)
        min_new_tokens = getattr(base.generation_config, "min_new_tokens", None) or 0
        banned = None
        if allowed is None and policy.suppress_token_ids:
            banned = torch.tensor(policy.suppress_token_ids, device=device)

        was_training = model.training
        model.eval()
        try:
            if inner is not None and hasattr(inner, "rope_deltas"):
                inner.rope_deltas = None  # set by the prefill when the prompts hold images; stale otherwise
            # 1-D families number each row's real tokens from 0 (as `generate` and `VLMPolicy.logprobs` do);
            # M-RoPE families (None here) compute theirs from the image grid.
            positions = policy.positions(inputs["attention_mask"]) if hasattr(policy, "positions") else None
            extra = {"position_ids": positions} if positions is not None else {}
            out = model(**inputs, **extra, use_cache=True, logits_to_keep=1)
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            logits = out.logits[:, -1]
            mask = inputs["attention_mask"]
            deltas = getattr(inner, "rope_deltas", None)
            if copies > 1:
                repeat_cache(cache, logits.shape[0], copies)
                logits, mask = logits.repeat_interleave(copies, dim=0), mask.repeat_interleave(copies, dim=0)
                deltas = deltas.repeat_interleave(copies, dim=0) if deltas is not None else None
            rows, prompt_len = mask.shape
            # Position of the first new token: after the real prompt tokens (M-RoPE), or after the padded prompt.
            if positions is not None:  # (PaliGemma numbers its positions from 1)
                start = mask.sum(-1, keepdim=True) + getattr(getattr(policy, "family", None), "first_position", 0)
            elif deltas is not None:
                start = mask.sum(-1, keepdim=True) + deltas.to(device)
            else:
                start = torch.full((rows, 1), prompt_len, device=device)
            done = torch.zeros(rows, dtype=torch.bool, device=device)
            tokens, logprobs = [], []
            for step in range(max_new_tokens):
                scores = logits.float() if allowed is None else logits[:, allowed].float()
                logp = torch.log_softmax(scores / temperature, dim=-1)  # [R, V'] the recorded distribution
                scores = logp
                if banned is not None:
                    scores = scores.index_fill(-1, banned, float("-inf"))
                if step < min_new_tokens and allowed is None:
                    scores = scores.index_fill(-1, eos, float("-inf"))
                if greedy:
                    index = scores.argmax(dim=-1)
                else:
                    index = sample_categorical(filter_top_k_top_p(scores, sampling.top_k, sampling.top_p))
                token = allowed[index] if allowed is not None else index
                if policy.pad_token_id is not None:
                    token = token.masked_fill(done, policy.pad_token_id)
                tokens.append(token)
                logprobs.append(logp.gather(-1, index.unsqueeze(-1)).squeeze(-1))
                done = done | torch.isin(token, eos)
                if step == max_new_tokens - 1 or bool(done.all()):
                    break
                mask = torch.cat([mask, mask.new_ones(rows, 1)], dim=1)
                position = start + step if positions is not None else (start + step).unsqueeze(0).expand(3, rows, 1)
                out = model(
                    input_ids=token.unsqueeze(-1),
                    attention_mask=mask,
                    position_ids=position,
                    use_cache=True,
                    logits_to_keep=1,
                    **{cache_key: cache},
                )
                logits = out.logits[:, -1]
        finally:
            model.train(was_training)
            if inner is not None and hasattr(inner, "rope_deltas"):
                inner.rope_deltas = None  # B rows' deltas must not reach a later forward of another batch
        return _finish(policy, torch.stack(tokens, dim=1), torch.stack(logprobs, dim=1), copies, group_size)
