"""What every kind shares of a model's real-size options: LoRA adapters (PEFT), frozen parts, gradient checkpointing,
and the weights with adapters merged in.

LoRA adapters go on the language model's linear layers (never `lm_head`; the vision tower's and its projector's only
with `model.lora.vision`); everything else is frozen. A VLA's added action-token rows stay trainable (PEFT's
`trainable_token_indices`: only those rows of the embedding, and of `lm_head` when it is not tied, train). Freezing
gives parameters `requires_grad=False`, so autograd records nothing for them: no activation memory, no gradients, no
optimiser state. Gradient checkpointing recomputes each block's activations in the backward pass (non-reentrant
`torch.utils.checkpoint`).

Checkpoints of a LoRA policy hold the unmerged base weights plus `lora/` (see `VLMPolicy.save_pretrained`), so a
resumed run continues exactly; `merge_lora` folds the adapters in for export, `merged_named_weights` for an engine.
`peft` is imported only here and only when LoRA is used: `pip install 'mmrl[lora]'`. Each kind applies its options
in its own `fit` (`mmrl.policy.vlm.options`, `mmrl.policy.flow.options`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import torch

from ..runtime.config import FREEZE_PARTS
from .tokens import ModelHolder

LORA_DIR = "lora"  # a LoRA checkpoint's adapters live in this subfolder (see VLMPolicy.save_pretrained)

# Attribute names under which transformers' VLMs keep their vision encoder, and their vision-to-text projector
# when it is not inside the encoder (Qwen2-VL / 2.5-VL / 3-VL: `model.visual`, which holds `merger` and, for
# Qwen3-VL, `deepstack_merger_list`; LLaVA-style models: `vision_tower` + `multi_modal_projector`).
VISION_TOWER_NAMES = ("visual", "vision_tower", "vision_model", "vision_encoder", "image_encoder")
VISION_PROJECTOR_NAMES = ("multi_modal_projector", "mm_projector", "visual_projection", "merger", "connector")


def require_peft():
    """The `peft` module, or an ImportError that names the extra to install."""
    try:
        import peft
    except ImportError as e:
        raise ImportError(
            "LoRA (model.lora.r > 0) needs PEFT, which is not installed: pip install 'mmrl[lora]' (or pip install peft)"
        ) from e
    return peft


def plain_model(model):
    """The transformers model under a PEFT wrapper (or the model itself)."""
    return model.get_base_model() if is_lora_model(model) else model


def is_lora_model(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def is_lora(policy: ModelHolder) -> bool:
    """Whether the policy's model carries PEFT adapters."""
    return is_lora_model(policy.model)


# ---------------------------------------------------------------------------------------------- vision tower
def find_vision_modules(model) -> dict[str, torch.nn.Module]:
    """The vision tower and, where separate, its projector: `{qualified name: module}`.

    Found by attribute name (`VISION_TOWER_NAMES`, `VISION_PROJECTOR_NAMES`) anywhere in the module tree, outermost
    first; a projector nested inside a found tower is part of it. Works on a PEFT-wrapped model too (names are then
    those of the wrapped model).

    Raises:
        ValueError: naming the model class when no vision module is found.
    """
    plain = plain_model(model)
    found: dict[str, torch.nn.Module] = {}
    for name, module in plain.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in VISION_TOWER_NAMES + VISION_PROJECTOR_NAMES:
            continue
        if any(name.startswith(outer + ".") for outer in found):
            continue  # inside a tower already found (Qwen's merger lives in `visual`)
        found[name] = module
    if not any(name.rsplit(".", 1)[-1] in VISION_TOWER_NAMES for name in found):
        raise ValueError(
            f"no vision tower found in {type(plain).__name__}: looked for submodules named "
            f"{', '.join(VISION_TOWER_NAMES)}; freeze_vision and LoRA's vision exclusion need one"
        )
    return found


PROJECTOR_NAMES = (*VISION_PROJECTOR_NAMES, "deepstack_merger_list")  # Qwen3-VL's deepstack mergers project too


def vision_linear_names(model) -> list[str]:
    """The qualified names of every linear layer of the vision tower and its projector (`find_vision_modules`), as
    the plain model names them: what LoRA's vision side (`model.lora.vision`) targets."""
    plain = plain_model(model)
    towers = find_vision_modules(plain)
    return [
        name
        for name, module in plain.named_modules()
        if isinstance(module, torch.nn.Linear) and any(name.startswith(tower + ".") for tower in towers)
    ]


def part_parameters(model, language: str | None = None) -> dict[str, dict[str, torch.nn.Parameter]]:
    """The model's parameters split into `FREEZE_PARTS`: the vision encoder, its projector (mergers), and the rest
    (the language model with its embeddings and head). `{part: {qualified name: parameter}}`.

    `language`: a name prefix; given, "language" holds only the parameters under it and the others belong to no part
    (a flow policy's action expert and its projections, which `model.freeze` never freezes)."""
    plain = plain_model(model)
    towers = [name for name in find_vision_modules(plain) if name.rsplit(".", 1)[-1] in VISION_TOWER_NAMES]
    parts: dict[str, dict[str, torch.nn.Parameter]] = {part: {} for part in FREEZE_PARTS}
    for name, param in plain.named_parameters():
        pieces = name.split(".")
        if any(piece in PROJECTOR_NAMES for piece in pieces):
            parts["projector"][name] = param
        elif any(name.startswith(tower + ".") for tower in towers):
            parts["vision"][name] = param
        elif language is None or name.startswith(language):
            parts["language"][name] = param
    return parts


def freeze_parts(policy: ModelHolder, parts: list[str], language: str | None = None) -> list[str]:
    """Freeze (`requires_grad=False`) the named parts of `FREEZE_PARTS` (`language`: as `part_parameters`'); returns
    the frozen parameter names."""
    unknown = [part for part in parts if part not in FREEZE_PARTS]
    if unknown:
        raise ValueError(f"unknown model part(s) {unknown}; choose from {', '.join(FREEZE_PARTS)}")
    split = part_parameters(policy.model, language)
    frozen = []
    for part in parts:
        for name, param in split[part].items():
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


def freeze_vision(policy: ModelHolder) -> list[str]:
    """Freeze the vision tower and its projector (`requires_grad=False`); returns their qualified names."""
    modules = find_vision_modules(policy.model)
    for module in modules.values():
        module.requires_grad_(False)
    return list(modules)


# ---------------------------------------------------------------------------------------------- checkpointing
def enable_gradient_checkpointing(policy: ModelHolder) -> None:
    """Recompute each block's activations in the backward pass (non-reentrant checkpoints).

    Non-reentrant checkpointing needs no input that requires grad, so frozen embeddings (LoRA) need no
    `enable_input_require_grads` for gradients to flow; transformers registers that hook itself anyway. It is
    active only in training mode; `generate` switches the model to eval, where it is off.
    """
    checkpoint_layers(plain_model(policy.model))


def checkpoint_layers(model) -> None:
    """Non-reentrant gradient checkpointing on every layer of a transformers model (a `PreTrainedModel`: a whole
    model, or one part of one such as a vision tower)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# ---------------------------------------------------------------------------------------------- LoRA
def _module_name(model, module: torch.nn.Module) -> str | None:
    return next((name for name, m in model.named_modules() if m is module), None)


def apply_lora(
    policy: ModelHolder,
    r: int,
    alpha: int = 32,
    dropout: float = 0.0,
    target_modules: str | list[str] = "all-linear",
    vision: bool = False,
    seed: int = 0,
) -> ModelHolder:
    """Wrap `policy.model` in PEFT LoRA adapters; only they (and a VLA's action-token rows) stay trainable.

    Args:
        r: adapter rank (> 0).
        alpha: LoRA scaling numerator (the update is `alpha / r * B @ A`).
        dropout: dropout on the adapter input.
        target_modules: "all-linear" (PEFT: every linear layer but the output head) or module names, as a list or
            a comma-separated string ("q_proj,v_proj").
        vision: also put adapters on every linear layer of the vision tower and its projector (`find_vision_modules`),
            whatever `target_modules` names (vision towers name their layers their own way: Qwen's `qkv`, SigLIP's
            `q_proj`). Off by default: the vision tower's module names overlap the language model's (Qwen2.5-VL's
            vision MLP has `gate_proj`/`up_proj`/`down_proj` too), so it is excluded explicitly.
        seed: seed of the adapters' initialisation (PEFT draws `lora_A` at random; `lora_B` starts at zero).

    Returns:
        The policy, its `model` now a `peft.PeftModel` (adapters in float32 whatever the base dtype).
    """
    peft = require_peft()
    if r <= 0:
        raise ValueError(f"LoRA rank must be > 0, got {r}")
    if is_lora(policy):
        raise ValueError("the policy already has LoRA adapters")
    model = policy.model
    if isinstance(target_modules, str) and target_modules != "all-linear":
        target_modules = [t.strip() for t in target_modules.split(",") if t.strip()]
    exclude = None
    towers = find_vision_modules(model)
    if not vision:
        exclude = "|".join(rf"{re.escape(name)}(\..*)?" for name in towers)
    elif target_modules != "all-linear":  # "all-linear" holds the vision tower's linear layers already
        target_modules = list(target_modules) + vision_linear_names(model)
    kwargs = {}
    if policy.action_codec is not None:
        # The K new action tokens must learn their embedding (and output) rows; PEFT trains just those rows.
        ids = policy.action_codec.token_ids.tolist()
        inputs, outputs = model.get_input_embeddings(), model.get_output_embeddings()
        layers = {_module_name(model, inputs).rsplit(".", 1)[-1]: ids}
        if outputs is not None and outputs.weight is not inputs.weight:  # untied head: its rows too
            layers[_module_name(model, outputs).rsplit(".", 1)[-1]] = ids
        kwargs["trainable_token_indices"] = layers
    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=target_modules,
        exclude_modules=exclude,
        **kwargs,
    )
    # PEFT draws lora_A from the global generator: unseeded, the adapters (and, through them, every gradient of
    # lora_B) would depend on whatever the process drew before. B = 0 hides that from the first loss, not from the
    # first gradient: it is why a torchrun run's step-1 grad norm differed from a single process's with an equal
    # loss. The draw happens on the CPU (PEFT moves the adapters to the base layer's device afterwards).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy.model = peft.get_peft_model(model, config)
    return policy


def merge_lora(policy: ModelHolder) -> ModelHolder:
    """Fold the adapters into the base weights (for export): `policy.model` becomes a plain transformers model.

    After this `save_pretrained` writes a standalone checkpoint that `from_pretrained` (ours or transformers')
    loads without PEFT. Training state tied to the adapters (an optimiser over them) is meaningless afterwards.
    """
    if not is_lora(policy):
        raise ValueError("the policy has no LoRA adapters to merge")
    policy.model = policy.model.merge_and_unload()
    return policy


ADAPTER_KEYS = ("lora_", "trainable_tokens_", ".modules_to_save.")
WRAPPER_PARTS = ((".token_adapter.base_layer.", "."), (".base_layer.", "."), (".original_module.", "."))


_PEFT_PREFIX = "base_model.model."  # a PeftModel's state-dict keys are the plain model's behind this prefix


def base_state_dict(model) -> dict[str, torch.Tensor]:
    """The weights of the model under the adapters, keyed as the plain transformers model keys them.

    PEFT renames wrapped weights (`q_proj.base_layer.weight`, `embed_tokens.token_adapter.base_layer.weight`)
    and adds its own (`lora_A`, `trainable_tokens_delta`); this undoes the first and drops the second, without
    touching the model (no merge/unmerge round trip, which is lossy in bfloat16).

    The weights come from `model.state_dict()`: under FSDP, `model` is the stand-in of `checkpoint_views`, whose
    state dict holds the full weights gathered from every process (the sharded model's own would be shards).
    """
    plain = {}
    for key, value in model.state_dict().items():
        key = key.removeprefix(_PEFT_PREFIX)
        if any(part in key for part in ADAPTER_KEYS):
            continue
        for wrapped, bare in WRAPPER_PARTS:
            key = key.replace(wrapped, bare)
        plain[key] = value
    return plain


def save_lora(policy: ModelHolder, path: str | Path) -> None:
    """Base weights as a plain checkpoint in `path`, adapters (and action-token rows) in `path/lora/`."""
    plain = plain_model(policy.model)
    plain.save_pretrained(path, state_dict=base_state_dict(policy.model))
    # The base weights (with any resized embedding) are saved above; PEFT need not copy whole embedding layers.
    policy.model.save_pretrained(Path(path) / LORA_DIR, save_embedding_layers=False)


def load_lora(policy: ModelHolder, folder: str | Path) -> ModelHolder:
    """Attach the adapters saved in `folder` (by `save_lora`) to the policy's model, trainable."""
    peft = require_peft()
    policy.model = peft.PeftModel.from_pretrained(policy.model, str(folder), is_trainable=True)
    return policy


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
