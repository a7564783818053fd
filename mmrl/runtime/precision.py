"""float32 master weights for a bfloat16 (or float16) model: `trainer.master_weights: float32`.

A bfloat16 weight has 8 significant bits: next to a weight of 0.02 the nearest other values are 6e-5 away, so an
AdamW step of lr = 1e-6 (about lr per element on the first steps) rounds back to the same weight, and full
fine-tuning in bfloat16 at a small learning rate trains nothing. The standard remedy (mixed-precision training as
in Micikevicius et al., https://arxiv.org/abs/1710.03740, DeepSpeed's bf16 optimiser, FSDP's MixedPrecisionPolicy)
keeps a float32 copy of every trainable weight: the forward and backward passes run in the low precision, the
optimiser steps the float32 copies, and the model gets them rounded.

How mmrl does it:

* The run loads the model in float32 (`train` loads with `model.dtype=float32`), so the copies start from the
  checkpoint's own values, and a resumed run from its float32 ones.
* One process: `MasterWeights` keeps the float32 copies, casts the model's *parameters* to `model.dtype` (buffers
  such as rotary frequencies stay as loaded, as `from_pretrained(dtype=...)` leaves them), moves each gradient into
  its copy in float32 as soon as backward produces it (so micro-batches accumulate in float32 too), and after the
  optimiser step writes the copies back. The model the trainer generates with is the plain low-precision model.
* Under torchrun FSDP2 does the same thing its own way (`shard_model(..., compute_dtype=...)`): the sharded
  parameters stay float32 and are the master weights, forward and backward all-gather them in `model.dtype`, and
  gradients are reduced in float32 (`MixedPrecisionPolicy(param_dtype, reduce_dtype=float32)`).
* Checkpoints hold the float32 master weights in both cases (`VLMPolicy.from_pretrained` loads them in any dtype).

The cost: 4 bytes per trainable parameter for its copy, and AdamW's two moments, which torch keeps in the dtype of
the parameters it steps, in float32 (8 bytes instead of 4).

Caveat: the model is loaded in float32, and what runs before the GRPO loop runs on it as loaded: a cold start
(`sft.episodes > 0`) trains and evaluates the float32 model with its own float32 AdamW, which for a 3B model is about
15 GB of weights and 30 GB of optimiser state before activations. Only then are the masters made and the model cast.
"""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}  # model.dtype's


def cast_parameters(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast `model`'s parameters (not its buffers) to `dtype` in place: what `from_pretrained(dtype=...)` gives,
    whose buffers (rotary frequencies) stay float32, where `model.to(dtype)` would cast those too."""
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)


class MasterWeights:
    """float32 copies of a low-precision model's trainable parameters, stepped by the optimiser (one process).

    Args:
        model: the model, its parameters float32 (or already in `dtype`); its trainable parameters get copies and
            every parameter is cast to `dtype` (buffers are left as they are).
        dtype: the precision the model computes in (`model.dtype` of the config).

    Use: build the optimiser over `params`; after the backward passes, clip and step as usual (the gradients are
    on `params`, float32); then `copy_to_model()`.
    """

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype):
        self.model = model
        self._trainable = [p for p in model.parameters() if p.requires_grad]
        # Parameters, so that optimisers and clip_grad_norm_ treat them as they treat the model's.
        self.params = [torch.nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in self._trainable]
        cast_parameters(model, dtype)
        for p, master in zip(self._trainable, self.params):
            p.register_post_accumulate_grad_hook(self._mover(master))

    @staticmethod
    def _mover(master: torch.nn.Parameter):
        def move(p: torch.Tensor) -> None:
            # Each backward's low-precision gradient is added to the float32 one and dropped from the model, so
            # accumulation over micro-batches rounds in float32, and the model holds no gradient memory between them.
            grad = p.grad.to(torch.float32)
            master.grad = grad if master.grad is None else master.grad.add_(grad)
            p.grad = None

        return move

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Write the (stepped) float32 weights into the model, rounded to its dtype."""
        for p, master in zip(self._trainable, self.params):
            p.copy_(master)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict in float32, its trainable weights the master copies (what a checkpoint holds).

        Tied parameters (embeddings and LM head) map to one tensor, so `save_pretrained` writes it once.
        """
        masters = {id(p): m.detach() for p, m in zip(self._trainable, self.params)}
        by_name = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            by_name[name] = masters.get(id(p))
        weights, cast = {}, {}
        for name, value in self.model.state_dict().items():
            if by_name.get(name) is not None:
                weights[name] = by_name[name]
            elif value.is_floating_point():  # frozen weights, in float32 like the rest (tied ones cast once)
                weights[name] = cast.setdefault(value.data_ptr(), value.to(torch.float32))
            else:
                weights[name] = value
        return weights
