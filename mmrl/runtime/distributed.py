"""Several processes, one model: FSDP2 under torchrun.

`torchrun --nproc_per_node=K -m mmrl train CONFIG` starts K processes. Each shards the model's parameters,
gradients and optimiser state with FSDP2 (`torch.distributed.fsdp.fully_shard`), collects the episodes of its
share of the step's prompts and trains on them; gradients are reduced across processes. Without torchrun's
environment variables (`WORLD_SIZE`, `RANK`, `LOCAL_RANK`) nothing here touches `torch.distributed`: `World()`
is the single process, and every helper is then the identity.

What makes K processes train what one process trains on the whole batch:

* GRPO groups never span processes: process r collects prompts [r*B/K, (r+1)*B/K) of the step, with the seeds one
  process would use, and generates them in seeded shards (`sim.seeds.sampling_seed`), so the completions drawn for a prompt
  depend on the shard layout, never on K. (PAPO's random image masks and the refills of the data filters are drawn
  per process: those runs are statistically, not sample for sample, alike.)
* Loss weights divide by the whole batch's token (or row) count, summed over processes (`World.sum`); FSDP averages
  gradients over processes, which the trainer undoes by scaling each backward by K. Estimators that normalise over
  the batch see every process's returns (`World.gather_rows`). Gradient clipping uses the global norm (the DTensor
  gradients make `clip_grad_norm_` reduce over processes). Logged metrics are reduced over processes
  (`World.reduce_metrics`), so every process sees the values rank 0 writes.
* Checkpoints hold full weights and the full optimiser state (`checkpoint_views`), loadable by
  `VLMPolicy.from_pretrained` in one process; a resumed run loads them in every process and shards them again.
  A LoRA policy's checkpoint, too, is what one process writes (base weights plus `lora/`), from the gathered state.
* LoRA adapters are sharded with the frozen base weights of their layer, and reduced like any gradient. They must
  start alike in every process and in a one-process run: `apply_lora` draws them from `model.seed`, not from the
  global generator, whose state differs between a torchrun worker and any other process (with B = 0 the first
  loss hides the difference, the first gradient does not).

Deadlocks, and how they are avoided. An FSDP forward all-gathers each layer's parameters and a backward
reduce-scatters its gradients: collectives that every process must enter in the same order. So:

* The update runs the same number of micro-batches in every process (`World.max` of the counts); a process with
  fewer rows repeats a slice with weight 0.
* Generation cannot: a process whose completions end sooner runs fewer forward passes, multi-turn episodes end
  after different numbers of turns, and a refilling filter samples a different number of batches. `full_weights`
  therefore gathers the parameters once, before generation (one collective, entered by every process), keeps them
  whole through every forward pass of the block, which then needs no communication at all, and frees them after
  (the FSDP2 counterpart of DeepSpeed's `GatheredParameters` that TRL uses for ZeRO-3 generation). Held-out
  evaluation runs the same way, each process playing a contiguous 1/K of the held-out seeds (`eval_shard`); the
  sums are added up over processes once every process is done, and rank 0 receives the recorded samples.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .metrics import to_float
from .schema import ConfigError


@dataclass(frozen=True)
class World:
    """This process's place among the K processes of a run (K = 1 without torchrun: every method is the identity).

    Collectives run on `device`: the process's GPU under NCCL, the CPU under gloo.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    device: str = "cpu"

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that prints and writes metrics, checkpoints and plots."""
        return self.rank == 0

    def sum(self, x):
        """`x` (a number or tensor) summed over processes; the same type and device come back."""
        return self._all_reduce(x, "sum")

    def max(self, x):
        """`x` (a number or tensor) maximised over processes."""
        return self._all_reduce(x, "max")

    def _all_reduce(self, x, op: str):
        if self.size == 1:
            return x
        import torch.distributed as dist

        t = torch.as_tensor(x).to(self.device, copy=True)
        dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.to(x.device) if isinstance(x, torch.Tensor) else t.item()

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier()

    def gather_objects(self, obj: Any, *, everyone: bool = True) -> list[Any] | None:
        """Every process's `obj` (picklable), in rank order: in every process, or with `everyone=False` in rank 0
        alone (the others get None; for large objects only rank 0 writes, such as recorded frames)."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        if everyone:
            out: list[Any] = [None] * self.size
            dist.all_gather_object(out, obj)
            return out
        out = [None] * self.size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def gather_rows(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Every process's `x` concatenated in rank order, and where this process's rows start.

        Args:
            x: `[n, ...]`; `n` may differ between processes, the trailing shape may not.

        Returns:
            `[sum of n, ...]` on `x`'s device, and the offset of this process's `n` rows in it.
        """
        if self.size == 1:
            return x, 0
        import torch.distributed as dist

        count = torch.tensor([x.shape[0]], device=self.device)
        counts = [torch.zeros_like(count) for _ in range(self.size)]
        dist.all_gather(counts, count)
        sizes = [int(c) for c in counts]
        padded = torch.zeros((max(sizes), *x.shape[1:]), dtype=x.dtype, device=self.device)
        padded[: x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(self.size)]
        dist.all_gather(parts, padded)
        return torch.cat([p[:n] for p, n in zip(parts, sizes)]).to(x.device), sum(sizes[: self.rank])

    def reduce_metrics(
        self,
        metrics: dict[str, Any],
        *,
        weight: float,
        weights: dict[str, float] | None = None,
        summed: Iterable[str] = (),
        maxed: Iterable[str] = (),
        minned: Iterable[str] = (),
    ) -> dict[str, Any]:
        """Metrics of the whole batch from each process's metrics of its share, the same in every process.

        Every process must pass the same keys in the same order (they come from the config and the env).

        Args:
            metrics: this process's values (numbers or scalar tensors).
            weight: how many items this process's means average over (its worlds).
            weights: a different count for some keys (e.g. rows, for per-row means).
            summed: keys whose values are already this process's share of a global sum (the loss terms, weighted by
                the global token or row count), or counts.
            maxed: keys to take the maximum of (times; values every process holds alike, such as the gradient norm).
            minned: keys to take the minimum of.

        Returns:
            `{key: float}` in `metrics`' order: count-weighted means, unless summed or maxed.
        """
        if self.size == 1:
            return metrics
        import torch.distributed as dist

        summed, minned, weights = set(summed), set(minned), weights or {}
        maxed = set(maxed) | minned  # a minimum is the negated maximum of the negated values
        keys = list(metrics)
        values = [-to_float(metrics[k]) if k in minned else to_float(metrics[k]) for k in keys]
        packed = []  # mean keys contribute (value * count, count), summed keys their value
        for k, v in zip(keys, values):
            if k in maxed:
                continue
            w = weights.get(k, weight)
            packed += [v] if k in summed else [v * w, w]
        sums = torch.tensor(packed, dtype=torch.float64, device=self.device)
        maxes = torch.tensor([v for k, v in zip(keys, values) if k in maxed], dtype=torch.float64, device=self.device)
        for t, op in ((sums, dist.ReduceOp.SUM), (maxes, dist.ReduceOp.MAX)):
            if t.numel():
                dist.all_reduce(t, op=op)
        sums_it, maxes_it = iter(sums.tolist()), iter(maxes.tolist())
        out = {}
        for k in keys:
            if k in maxed:
                out[k] = -next(maxes_it) if k in minned else next(maxes_it)
            elif k in summed:
                out[k] = next(sums_it)
            else:
                total, count = next(sums_it), next(sums_it)
                out[k] = total / count if count else float("nan")
        return out


def init_world(device: str = "cpu") -> World:
    """The `World` torchrun describes in the environment, with its process group started (NCCL for a CUDA
    `device`, else gloo) and, on CUDA, this process's GPU selected; `World()` when not under torchrun.

    Args:
        device: `model.device` of the config ("cpu", "cuda", ...).
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    missing = [k for k in ("RANK", "LOCAL_RANK") if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={size} but {', '.join(missing)} unset: launch with torchrun")
    import torch.distributed as dist

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        if cuda:
            dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
        else:
            dist.init_process_group("gloo")
    return World(rank=rank, size=size, local_rank=local_rank, device=f"cuda:{local_rank}" if cuda else "cpu")


def close_world() -> None:
    """End the process group, if one was started."""
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def eval_shard(episodes: int, world: World) -> range:
    """The held-out episodes this process plays: a contiguous block, the first `episodes % K` processes one more.

    Contiguous, so that the first episodes (those whose samples the trainer draws and writes) are rank 0's.
    """
    per, extra = divmod(episodes, world.size)
    start = world.rank * per + min(world.rank, extra)
    return range(start, start + per + (world.rank < extra))


def prompt_shards(batch: int, shards: int, world: World) -> range:
    """The prompt shards this process generates: the step's B prompts fall into `shards` shards of B/S contiguous
    prompts (whole GRPO groups), and each of the K processes takes S/K consecutive shards."""
    if batch % world.size:
        raise ConfigError(
            f"trainer.prompts_per_step={batch} is not valid with {world.size} processes: it must be a multiple of "
            f"{world.size} (each process collects whole groups of an equal share of the prompts)"
        )
    if shards < 1 or batch % shards or shards % world.size:
        raise ConfigError(
            f"trainer.generation_shards={shards} is not valid: it must divide trainer.prompts_per_step={batch} and be a "
            f"multiple of the {world.size} processes"
        )
    per = shards // world.size
    return range(world.rank * per, (world.rank + 1) * per)


def shard_model(
    model: torch.nn.Module, world: World, *, frozen: bool = False, compute_dtype: torch.dtype | None = None
) -> torch.nn.Module:
    """Shard `model` in place across the processes with FSDP2 (returned for convenience; unchanged when K = 1).

    Every decoder layer and vision block (the model's `_no_split_modules`) becomes one FSDP unit, so only one
    layer's full parameters exist at a time, and the root holds the rest (embeddings, tied head, norms, merger).
    The processes first take rank 0's weights: models built or loaded in each process could differ (a GPU cold
    start is not bit-reproducible), and each keeps only its own slice of its own copy.

    Args:
        model: the policy's (or the reference's) model, on its device, before an optimiser holds its parameters.
        world: the processes.
        frozen: a model that is never trained (the KL reference): the root is resharded after forward as well,
            since no backward would free it.
        compute_dtype: with a float32 model, run forward and backward in this dtype: FSDP gathers the parameters
            in it, and reduces gradients in float32 into the float32 shards, which are the master weights
            (`trainer.master_weights`; see `mmrl.runtime.precision`). None: compute in the parameters' dtype.
    """
    if world.size == 1:
        return model
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # Inputs are not cast (FSDP's default casts every unit's floating inputs, rotary tables included): the units then
    # compute exactly what a model loaded in compute_dtype computes in one process (`mmrl.runtime.precision`).
    mixed = MixedPrecisionPolicy(
        param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype else None, cast_forward_inputs=False
    )
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    mesh = init_device_mesh(torch.device(world.device).type, (world.size,))
    layers = set(getattr(model, "_no_split_modules", None) or ())
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layers:
            fully_shard(module, mesh=mesh, mp_policy=mixed)
    fully_shard(model, mesh=mesh, reshard_after_forward=True if frozen else None, mp_policy=mixed)
    # Fix the root now: generation calls the vision tower before the root's forward, and FSDP would otherwise
    # take whichever unit runs first for the root.
    model._get_fsdp_state()._lazy_init()
    return model


def _is_sharded(model: torch.nn.Module) -> bool:
    fsdp = sys.modules.get("torch.distributed.fsdp")  # never imported by a single-process run
    return fsdp is not None and isinstance(model, fsdp.FSDPModule)


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether any module of `model` is sharded by FSDP2 (`shard_model`; a LoRA wrapper's base model included)."""
    return any(_is_sharded(m) for m in model.modules())


def parameter_versions(model: torch.nn.Module) -> tuple[int, ...]:
    """Version counters of `model`'s parameters, which every in-place write bumps (`optimizer.step()`, or a queued
    step's weights copied into the collector thread's copy, which trains nothing), also for a model FSDP2 shards:
    there the sharded parameters' counters, since inside `full_weights` the whole parameters are all-gathered into the
    same tensors again without a counter moving (seen: a step left them all at 0), so the whole parameters' counters
    cannot tell whether the weights changed."""
    if not is_sharded(model):
        return tuple(p._version for p in model.parameters())
    versions = []
    for module in model.modules():
        if _is_sharded(module):
            group = module._get_fsdp_state()._fsdp_param_group  # None for a unit without parameters of its own
            versions += [fp.sharded_param._version for fp in (group.fsdp_params if group is not None else ())]
    return tuple(versions)


def unsharded_class(module: torch.nn.Module) -> type:
    """`module`'s own class: for a module FSDP2 shards, the class `fully_shard` derived `FSDP<cls>(FSDPModule, cls)`
    from (its name is what transformers' configs and vLLM know the architecture by)."""
    cls = type(module)
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None and issubclass(cls, fsdp.FSDPModule):
        cls = next(c for c in cls.__mro__ if not issubclass(c, fsdp.FSDPModule))
    return cls


def unsharded_module(module: torch.nn.Module, device: torch.device | str = "cpu") -> torch.nn.Module:
    """A new, unsharded instance of a transformers model's class (FSDP2's subclass undone), built from a copy of its
    config on `device` with uninitialised parameters (no random draw: the caller writes them), tied weights tied,
    `module`'s buffers and generation config copied, not trained.

    What another process or thread samples with while the model itself is sharded: `copy.deepcopy` refuses an FSDP
    module, and a copy built from the config holds whole weights that need no collective to read.
    """
    cls = unsharded_class(module)
    dtype = next(module.parameters()).dtype
    with torch.device("meta"):
        copy_ = cls._from_config(copy.deepcopy(module.config), dtype=dtype)
    copy_.to_empty(device=device)
    copy_.tie_weights()
    with torch.no_grad():  # buffers (rotary frequencies...) are not sharded, and `to_empty` left them uninitialised
        own = dict(copy_.named_buffers())
        for name, buffer in module.named_buffers():
            if name in own:
                own[name].copy_(buffer)
    if getattr(module, "generation_config", None) is not None:
        copy_.generation_config = copy.deepcopy(module.generation_config)
    return copy_.requires_grad_(False).eval()


@contextlib.contextmanager
def full_weights(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, `model`'s parameters are whole in every process and its forward passes communicate
    nothing, so processes may run different numbers of them (generation, evaluation). No-op for a plain model.

    Every process must enter the block together (the gathering is a collective). The block runs without gradients
    (generation, evaluation); training forwards belong outside it. For a model sharded by `shard_model`, which this
    restores on leaving.
    """
    if not _is_sharded(model):
        yield
        return
    units = [m for m in model.modules() if _is_sharded(m)]
    for unit in units:  # the one all-gather per unit, in the same order in every process
        unit.unshard()
    model.set_reshard_after_forward(False)  # forward passes keep them (FSDP's "running evals" setting)
    # transformers turns on `synced_gpus` for an FSDP-managed model: an all-reduce per generated token, so that
    # processes step together. With whole weights nothing needs that, and it would hang a process whose episodes
    # take more (or fewer) generate calls than another's.
    model._is_fsdp_managed_module = False
    try:
        yield
    finally:
        model._is_fsdp_managed_module = True
        model.set_reshard_after_forward(True)  # back to shard_model's setting: every unit frees after forward...
        model.set_reshard_after_forward(False, recurse=False)  # ...but the root, which backward needs first
        for unit in units:
            unit.reshard()


def clip_grad_norm(params: torch.nn.Module | Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_` over a model's parameters (or the given ones, such as float32 master
    weights), returning the global norm as a plain tensor.

    With FSDP2 the gradients are DTensor shards and torch's function already reduces the norm over processes; only
    its result is a DTensor, made whole here for logging.
    """
    params = params.parameters() if isinstance(params, torch.nn.Module) else params
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


class _GatheredModel:
    """A sharded model as `VLMPolicy.save_pretrained` sees it on rank 0: it saves full weights gathered before."""

    def __init__(self, model: torch.nn.Module, state_dict: dict[str, torch.Tensor]):
        self._model, self._state_dict = model, state_dict

    def save_pretrained(self, path, **kwargs) -> None:
        self._model.save_pretrained(path, state_dict=self._state_dict, **kwargs)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The gathered weights (what `save_lora` splits into base weights and adapters)."""
        return self._state_dict

    def __getattr__(self, name: str):
        return getattr(self._model, name)


class _GatheredOptimizer:
    """A sharded optimiser as `save_checkpoint` sees it on rank 0: its full state, keyed by parameter name."""

    def __init__(self, state: dict[str, Any]):
        self._state = state

    def state_dict(self) -> dict[str, Any]:
        return self._state


def checkpoint_views(policy, optimizer: torch.optim.Optimizer, world: World):
    """`(policy, optimizer)` as `save_checkpoint` should get them: themselves in a single process.

    Under FSDP every process must call this (gathering is collective). Rank 0 gets stand-ins that save the full
    weights, loadable by `VLMPolicy.from_pretrained` in one process, and the full optimiser state; the other ranks
    get `(None, None)` and save nothing.
    """
    if world.size == 1:
        return policy, optimizer
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # full tensors on rank 0's CPU only
    weights = get_model_state_dict(policy.model, options=options)
    optimizer_state = get_optimizer_state_dict(policy.model, optimizer, options=options)
    if not world.is_main:
        return None, None
    # Gathering copies tied parameters (embeddings and LM head) apart; tie them again, so that save_pretrained
    # recognises them and writes one, as it does for the unsharded model.
    tied: dict[int, list[str]] = {}
    for name, p in policy.model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    for first, *others in tied.values():
        for name in others:
            if first in weights and name in weights:
                weights[name] = weights[first]
    return with_weights(policy, weights), _GatheredOptimizer(optimizer_state)


def with_weights(policy, weights: dict[str, torch.Tensor]):
    """A view of `policy` whose `save_pretrained` writes `weights` (a full state dict of its model) instead of the
    model's own: the full weights gathered from the shards, or float32 master weights (`mmrl.runtime.precision`)."""
    view = copy.copy(policy)
    view.model = _GatheredModel(policy.model, weights)
    return view


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, world: World):
    """Restore a checkpoint's optimiser state: `load_state_dict` in one process; under FSDP, the full state that
    `checkpoint_views` saved, of which each process keeps its slice."""
    if world.size == 1:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
