"""`mmrl export RUN_OR_CHECKPOINT OUT`: a trained policy as a standalone Hugging Face model folder.

The source is a run's output folder (its latest checkpoint is taken) or one checkpoint folder. LoRA adapters are
merged into the weights (`merge_lora`), so the folder needs no PEFT; training state (optimiser, scheduler, RNG) is
left behind. What is written: the model (`config.json`, `model.safetensors`, `generation_config.json`), the
tokenizer with its chat template, the image processor's config, and for a VLA the action codec (`action_codec.json`,
read by `VLMPolicy.from_pretrained`; the action tokens themselves are in the tokenizer and the embedding rows).
`AutoModelForImageTextToText.from_pretrained(OUT)`, `AutoTokenizer` and `AutoImageProcessor` load it; so does
`AutoProcessor` where torchvision is installed (transformers builds Qwen-VL processors with a video processor,
which needs it).

A flow policy's checkpoint (π0: config.json's model_type "pi0", as `mmrl.policy.kind_of` tells them apart) is
written by `FlowPolicy.save_pretrained`: the model, which `PI0ForConditionalGeneration.from_pretrained(OUT)` loads,
its tokenizer, the image settings (`preprocessor_config.json`) and the normalisation statistics with the Flow-SDE
settings (`processor_config.json`, in `PI0Processor`'s fields), and Flow-Noise's head where it has one;
`model.path=OUT` loads it back as the same policy. LoRA adapters (on the backbone, the action expert or both) are
merged first, as a VLM's.

    mmrl export runs/grounding_tiny exported/grounding_tiny [--dtype bfloat16]
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from sim.errors import InputError

from .policy import kind_of
from .policy.lora import is_lora, merge_lora
from .runtime.checkpoint import latest_checkpoint
from .runtime.config import ModelConfig

EXPORT_DTYPES = {"auto": "auto", "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def checkpoint_of(source: str | Path) -> Path:
    """The checkpoint folder `source` names: itself, or a run folder's latest checkpoint."""
    source = Path(source)
    if (source / "config.json").is_file() and (source / "model.safetensors").exists():
        return source
    found = latest_checkpoint(source) if (source / "checkpoints").is_dir() else None
    if found is None:
        raise InputError(f"{source} is neither a checkpoint folder nor a run folder with checkpoints/")
    return found


def export(source: str | Path, out: str | Path, dtype: str = "auto") -> Path:
    """Write the policy at `source` (a run or checkpoint folder) to `out` as a standalone model; returns `out`.

    Args:
        source: a run's output folder or a checkpoint folder.
        out: the folder to write; must not exist or be empty.
        dtype: the weights' dtype: "auto" (as stored: float32 masters stay float32), "bfloat16", "float16",
            "float32".
    """
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {', '.join(EXPORT_DTYPES)}")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} is a file; export writes a fresh folder: name one that does not exist")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not empty; export writes a fresh folder")
    checkpoint = checkpoint_of(source)
    # Its own kind loads it (`kind_of`) and writes it back as a plain folder once any LoRA is merged.
    policy = kind_of(checkpoint).load(checkpoint, ModelConfig(path=str(checkpoint)), EXPORT_DTYPES[dtype])
    merged = is_lora(policy)
    if merged:
        merge_lora(policy)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # a file on the way, no permission, a read-only disk
        raise InputError(f"cannot create {out}: {error.strerror or error}") from None
    policy.save_pretrained(out)
    _write_note(out, checkpoint, merged, policy.model.dtype)
    return out


def _write_note(out: Path, checkpoint: Path, merged: bool, dtype: torch.dtype) -> None:
    """`mmrl_export.json`: where the folder came from (no loader reads it)."""
    note = {"source": str(checkpoint), "lora_merged": merged, "dtype": str(dtype)}
    (out / "mmrl_export.json").write_text(json.dumps(note, indent=2))
