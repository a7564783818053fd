"""A contract checker for `VecEnv` implementations, in the manner of Gymnasium's `check_env`.

Every registered env is run through `check_vec_env` by `tests/sim/test_contract.py`. The checks are the
promises of `sim/base.py`: shapes and dtypes, seeding, partial resets that leave other worlds alone, and
returned tensors that are fresh copies rather than views of the env's buffers (ManiSkill PR #828).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from sim.base import Observation, StepResult, VecEnv

# Text actions that any text env must survive: empty, truncated, plain prose, and one well-formed-looking answer.
_GARBAGE_TEXTS = ["", "[1,2", "no idea", "<answer>[0, 0, 10, 10]</answer>", "<answer>[5, 5, 2]</answer>", "}{"]

# A seed far from `seed + k` for small k, so that "a different seed" never collides with another world's seed.
_SEED_OFFSET = 1_000_003


def check_vec_env(env: VecEnv, seed: int = 0, actions: list[str] | torch.Tensor | None = None) -> None:
    """Check that `env` keeps the `VecEnv` contract; raise `AssertionError` naming the first violation.

    The env is reset and stepped several times; it is left in an arbitrary state afterwards (not closed).

    Args:
        env: The env to check, holding N worlds.
        seed: Base seed; world k of a full reset gets `seed + k`.
        actions: Actions for `step`: N strings for text envs, a `[N, D]` tensor for continuous ones. Defaults to
            a mix of garbage strings for text envs and zeros `[N, env.action_dim]` for continuous ones.

    Raises:
        AssertionError: The env breaks the contract; the message says how.
    """
    name = type(env).__name__
    _check_attributes(env, name)
    n = env.num_envs
    if actions is None:
        actions = _default_actions(env, name)

    # --- reset: shapes, dtypes, determinism -------------------------------------------------------------------
    obs = env.reset(seed=seed)
    _check_observation(obs, n, f"{name}.reset")
    again = env.reset(seed=seed)
    _check_observation(again, n, f"{name}.reset")
    assert _same_images(obs.image, again.image), f"{name}: reset(seed={seed}) twice gave different images"
    assert obs.instruction == again.instruction, f"{name}: reset(seed={seed}) twice gave different instructions"
    assert (obs.proprio is None) == (again.proprio is None) and (
        obs.proprio is None or torch.equal(obs.proprio.cpu(), again.proprio.cpu())
    ), f"{name}: reset(seed={seed}) twice gave different obs.proprio"
    _check_no_shared_storage(_tensors(obs), _tensors(again), f"{name}: two reset() calls")
    other = env.reset(seed=[seed + _SEED_OFFSET + k for k in range(n)])
    assert not _same_images(obs.image, other.image), (
        f"{name}: reset with seeds {seed}+k and {seed + _SEED_OFFSET}+k gave identical images in every world; "
        "is the seed ignored?"
    )

    # --- partial reset: only the named worlds change ----------------------------------------------------------
    obs = env.reset(seed=seed)
    before = obs.image.clone()  # [N, H, W, 3]
    before_instr = list(obs.instruction)
    world = 1 if n > 1 else 0
    partial = env.reset(seed=[seed + _SEED_OFFSET], env_ids=[world])
    _check_observation(partial, n, f"{name}.reset(env_ids=[{world}])")
    assert partial.image.shape == before.shape, (
        f"{name}: reset(env_ids=[{world}]) must return the observation of all {n} worlds, "
        f"got image {tuple(partial.image.shape)}"
    )
    for k in range(n):
        if k == world:
            continue
        assert torch.equal(partial.image[k].cpu(), before[k].cpu()), (
            f"{name}: reset(env_ids=[{world}]) changed the image of world {k}"
        )
        assert partial.instruction[k] == before_instr[k], (
            f"{name}: reset(env_ids=[{world}]) changed the instruction of world {k}"
        )
    assert not torch.equal(partial.image[world].cpu(), before[world].cpu()), (
        f"{name}: reset(env_ids=[{world}]) with a new seed left world {world}'s image unchanged"
    )
    # World k of a full reset got seed + k; a partial reset with that same seed must rebuild the same world.
    restored = env.reset(seed=[seed + world], env_ids=[world])
    assert torch.equal(restored.image[world].cpu(), before[world].cpu()), (
        f"{name}: reset(seed=[{seed + world}], env_ids=[{world}]) did not reproduce world {world} of "
        f"reset(seed={seed}); a world's state must depend on its own seed only"
    )

    # --- returned tensors are copies: mutating them must not reach the env ------------------------------------
    obs = env.reset(seed=seed)
    before = obs.image.clone()  # [N, H, W, 3]
    _scribble(obs.image)
    if n > 1:
        # A partial reset returns the untouched worlds from the env's own state: they must not show the scribble.
        partial = env.reset(seed=[seed + _SEED_OFFSET], env_ids=[0])
        for k in range(1, n):
            assert torch.equal(partial.image[k].cpu(), before[k].cpu()), (
                f"{name}: writing into the image returned by reset() changed world {k}'s image later on; "
                "reset() must return a copy, not a view of the env's buffer"
            )

    # --- step: types, shapes, determinism, copies -------------------------------------------------------------
    env.reset(seed=seed)
    first = env.step(_copy_actions(actions))
    _check_step_result(first, n, name)
    first_reward = first.reward.clone()  # [N]
    first_image = first.obs.image.clone()  # [N, H, W, 3]
    for tensor in _tensors(first):
        _scribble(tensor)
    env.reset(seed=seed)
    second = env.step(_copy_actions(actions))
    _check_step_result(second, n, name)
    assert torch.equal(second.reward.cpu(), first_reward.cpu()), (
        f"{name}: the same seed and actions gave rewards {first_reward.tolist()} then {second.reward.tolist()}; "
        "either step is not deterministic given the reset seed, or the returned reward is a view of a buffer"
    )
    assert _same_images(second.obs.image, first_image), (
        f"{name}: the same seed and actions gave different step observations; either step is not deterministic "
        "given the reset seed, or the returned image is a view of a buffer"
    )
    _check_no_shared_storage(_tensors(first), _tensors(second), f"{name}: two step() calls")
    if obs.proprio is not None:  # a policy reads one width for the whole episode
        assert second.obs.proprio is not None and second.obs.proprio.shape == obs.proprio.shape, (
            f"{name}: obs.proprio is {tuple(obs.proprio.shape)} after reset but "
            f"{None if second.obs.proprio is None else tuple(second.obs.proprio.shape)} after step"
        )
    third = env.reset(seed=seed)
    _check_no_shared_storage(_tensors(second), _tensors(third), f"{name}: step() then reset()")


def _check_attributes(env: VecEnv, name: str) -> None:
    assert isinstance(env, VecEnv), f"{name} does not implement the VecEnv protocol (num_envs, action_kind, ...)"
    assert isinstance(env.num_envs, int) and env.num_envs >= 1, f"{name}.num_envs must be a positive int"
    assert env.action_kind in ("text", "continuous"), (
        f"{name}.action_kind must be 'text' or 'continuous', got {env.action_kind!r}"
    )
    assert isinstance(env.max_episode_steps, int) and env.max_episode_steps >= 1, (
        f"{name}.max_episode_steps must be a positive int, got {env.max_episode_steps!r}"
    )


def _default_actions(env: VecEnv, name: str) -> list[str] | torch.Tensor:
    n = env.num_envs
    if env.action_kind == "text":
        return [_GARBAGE_TEXTS[k % len(_GARBAGE_TEXTS)] for k in range(n)]
    dim = getattr(env, "action_dim", None)
    assert isinstance(dim, int) and dim >= 1, f"continuous env {name} must expose action_dim (a positive int)"
    return torch.zeros(n, dim)  # [N, D]


def _copy_actions(actions: list[str] | torch.Tensor) -> list[str] | torch.Tensor:
    # The env may legitimately keep what it is given; hand it a fresh copy each call so checks stay independent.
    return actions.clone() if isinstance(actions, torch.Tensor) else list(actions)


def _check_observation(obs: Any, n: int, where: str) -> None:
    assert isinstance(obs, Observation), f"{where} must return an Observation, got {type(obs).__name__}"
    image = obs.image
    assert isinstance(image, torch.Tensor), f"{where}: obs.image must be a tensor, got {type(image).__name__}"
    assert image.dtype == torch.uint8, f"{where}: obs.image must be uint8, got {image.dtype}"
    assert image.dim() in (4, 5) and image.shape[0] == n and image.shape[-1] == 3, (
        f"{where}: obs.image must be [N={n}, H, W, 3] (or [N, V, H, W, 3] for V views), got {tuple(image.shape)}"
    )
    assert image.is_contiguous(), f"{where}: obs.image must be contiguous (strides {image.stride()})"
    assert isinstance(obs.instruction, list) and len(obs.instruction) == n, (
        f"{where}: obs.instruction must be a list of {n} strings, got {type(obs.instruction).__name__} "
        f"of length {len(obs.instruction) if hasattr(obs.instruction, '__len__') else '?'}"
    )
    bad = [k for k, s in enumerate(obs.instruction) if not isinstance(s, str)]
    assert not bad, f"{where}: obs.instruction entries {bad} are not strings"
    if obs.state is not None:
        assert isinstance(obs.state, torch.Tensor) and obs.state.dim() >= 1 and obs.state.shape[0] == n, (
            f"{where}: obs.state must be None or a tensor with leading dim N={n}"
        )
    if obs.proprio is not None:
        proprio = obs.proprio
        assert isinstance(proprio, torch.Tensor) and proprio.dim() == 2 and proprio.shape[0] == n, (
            f"{where}: obs.proprio must be None or a [N={n}, P] tensor, got "
            f"{tuple(proprio.shape) if isinstance(proprio, torch.Tensor) else type(proprio).__name__}"
        )
        assert proprio.is_floating_point(), f"{where}: obs.proprio must be a float tensor, got {proprio.dtype}"
        assert bool(torch.isfinite(proprio).all()), f"{where}: obs.proprio has non-finite entries"


def _check_step_result(result: Any, n: int, name: str) -> None:
    where = f"{name}.step"
    assert isinstance(result, StepResult), f"{where} must return a StepResult, got {type(result).__name__}"
    _check_observation(result.obs, n, where)
    for field_name, dtype in (("reward", torch.float32), ("terminated", torch.bool), ("truncated", torch.bool)):
        value = getattr(result, field_name)
        assert isinstance(value, torch.Tensor), f"{where}: {field_name} must be a tensor, got {type(value).__name__}"
        assert value.dtype == dtype, f"{where}: {field_name} must be {dtype}, got {value.dtype}"
        assert tuple(value.shape) == (n,), f"{where}: {field_name} must have shape [N={n}], got {tuple(value.shape)}"
    assert bool(torch.isfinite(result.reward).all()), f"{where}: reward has non-finite entries {result.reward}"
    assert isinstance(result.info, dict), f"{where}: info must be a dict, got {type(result.info).__name__}"
    for key, value in _walk(result.info, "info"):
        if isinstance(value, torch.Tensor):
            assert value.dim() >= 1 and value.shape[0] == n, (
                f"{where}: {key} must have leading dim N={n}, got shape {tuple(value.shape)}"
            )
        elif isinstance(value, list):
            assert len(value) == n, f"{where}: {key} is a list of length {len(value)}, expected N={n}"


def _walk(tree: dict, prefix: str) -> Iterator[tuple[str, Any]]:
    """Leaves of a nested dict as ("info['a']['b']", value) pairs."""
    for key, value in tree.items():
        path = f"{prefix}[{key!r}]"
        if isinstance(value, dict):
            yield from _walk(value, path)
        else:
            yield path, value


def _tensors(obj: Observation | StepResult) -> list[torch.Tensor]:
    """Every tensor an Observation or StepResult hands out, including those nested in info."""
    if isinstance(obj, Observation):
        return [t for t in (obj.image, obj.state, obj.proprio) if t is not None]
    found = _tensors(obj.obs) + [obj.reward, obj.terminated, obj.truncated]
    found += [value for _, value in _walk(obj.info, "info") if isinstance(value, torch.Tensor)]
    return found


def _check_no_shared_storage(old: list[torch.Tensor], new: list[torch.Tensor], where: str) -> None:
    # Two calls handing out the same memory means at least one of them returned a view of an env buffer.
    old_ptrs = {t.untyped_storage().data_ptr() for t in old if t.numel() > 0}
    shared = [t for t in new if t.numel() > 0 and t.untyped_storage().data_ptr() in old_ptrs]
    assert not shared, (
        f"{where} returned tensors sharing memory (shapes {[tuple(t.shape) for t in shared]}); "
        "return fresh copies, not views of the env's buffers"
    )


def _scribble(tensor: torch.Tensor) -> None:
    """Overwrite a returned tensor in place with values that differ from the original everywhere."""
    if tensor.dtype == torch.bool:
        tensor.logical_not_()
    elif tensor.dtype == torch.uint8:
        tensor.add_(128)  # wraps around, so every byte changes
    elif tensor.is_floating_point():
        tensor.copy_(torch.where(torch.isnan(tensor), torch.zeros_like(tensor), -tensor - 12345.0))
    else:
        tensor.add_(1)


def _same_images(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.cpu(), b.cpu())
