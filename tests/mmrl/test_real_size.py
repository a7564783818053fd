"""Real-size training options on the tiny real models: checkpointing, frozen vision, LoRA, token-budget slices.

Every option is checked against the plain model it replaces: gradient checkpointing gives the same loss and
gradients, a frozen vision tower does not move while the language model does, LoRA trains only its adapters (and a
VLA's action-token rows), merging the adapters changes no logit, and a LoRA checkpoint loads back to the same
log-probs and the same trainable parameters.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from transformers import AutoModelForImageTextToText

from mmrl.policy import Sampling, VLMPolicy, add_action_tokens
from mmrl.policy.lora import (
    apply_lora,
    base_state_dict,
    enable_gradient_checkpointing,
    find_vision_modules,
    freeze_vision,
    is_lora,
    merge_lora,
    merged_named_weights,
)
from mmrl.policy.vlm.options import apply_model_options
from mmrl.runtime.config import ConfigError, LoRAConfig, ModelConfig
from mmrl.stages.batching import token_budget_slices, trim_padding

SAMPLING = Sampling(max_new_tokens=6, temperature=1.0)


def boost_eos(policy: VLMPolicy, amount: float = 3.0) -> None:
    """Make EOS likely (via the head's output), so rows of a rollout end at different lengths."""
    bias = torch.zeros(policy.model.config.text_config.vocab_size)
    bias[policy.eos_token_ids] = amount
    policy.model.lm_head.register_forward_hook(lambda module, args, out: out + bias)


def loss_of(policy: VLMPolicy, rollout) -> torch.Tensor:
    """A policy-gradient-shaped scalar: the masked mean log-prob, weighted by a fixed advantage per row."""
    advantages = torch.linspace(-1.0, 1.0, len(rollout)).unsqueeze(-1)  # [R, 1]
    logprobs = policy.logprobs(rollout)
    mask = rollout.completion_mask
    return -(logprobs * advantages * mask).sum() / mask.sum()


@pytest.fixture(scope="module")
def text_rollout(tiny_policy, grounding_obs):
    """(arch, rollout) from a tiny Qwen2.5-VL: B=2 x G=2 completions of up to 6 tokens, some ending early."""
    policy = tiny_policy("qwen2_5_vl", seed=0)
    boost_eos(policy)
    for seed in range(10):  # the first seed whose draw ends rows at different lengths
        torch.manual_seed(seed)
        rollout = policy.generate(grounding_obs("qwen2_5_vl", [0, 0, 1, 1]), group_size=2, sampling=SAMPLING)
        if rollout.completion_mask.sum(-1).unique().numel() > 1:
            return rollout
    raise AssertionError("no seed ended rows at different lengths")


def vla(tiny_policy, arch: str = "qwen2_5_vl") -> tuple[VLMPolicy, torch.Tensor]:
    policy = tiny_policy(arch, seed=0, prompt_template="{image} {instruction}")
    codec = add_action_tokens(policy, torch.full((2,), -1.0), torch.ones(2), bins=8)
    return policy, codec.token_ids


# ---------------------------------------------------------------------------------------------- token budget
def test_token_budget_slices_by_hand():
    prompt = torch.tensor([[1, 1, 1], [0, 1, 1], [0, 0, 1], [1, 1, 1]], dtype=torch.bool)  # lengths 3, 2, 1, 3
    completion = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)  # 2,4,1,1
    # Row costs as slices grow: [0,1) 1*(3+2)=5, [0,2) 2*(3+4)=14, [0,3) 3*(3+4)=21, [0,4) 4*(3+4)=28.
    assert token_budget_slices(prompt, completion, budget=28) == [(0, 4)]
    assert token_budget_slices(prompt, completion, budget=27) == [(0, 3), (3, 4)]  # [3,4) costs 1*(3+1)=4
    assert token_budget_slices(prompt, completion, budget=14) == [(0, 2), (2, 4)]  # [2,4) costs 2*(3+1)=8
    assert token_budget_slices(prompt, completion, budget=13) == [(0, 1), (1, 3), (3, 4)]  # [1,3) costs 2*(2+4)=12
    # A row over the budget on its own still gets a slice (never dropped); nothing is merged into it.
    assert token_budget_slices(prompt, completion, budget=4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    # Padding inside the masks does not count: only each row's extent does.
    assert token_budget_slices(prompt[:, -1:], completion[:, :1], budget=2) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert token_budget_slices(prompt[:, -1:], completion[:, :1], budget=8) == [(0, 4)]  # 4 rows * (1 + 1)
    with pytest.raises(ValueError, match="budget"):
        token_budget_slices(prompt, completion, budget=0)


def test_trimmed_slices_score_like_the_full_rows(tiny_policy, text_rollout):
    policy = tiny_policy("qwen2_5_vl", seed=0)
    full = policy.logprobs(text_rollout).detach()
    prompt_len, completion_len = text_rollout.prompt_mask.sum(-1), text_rollout.completion_mask.sum(-1)
    budget = 2 * int(prompt_len[:2].max() + completion_len[:2].max())  # rows 0-1 fit, not 0-2
    slices = token_budget_slices(text_rollout.prompt_mask, text_rollout.completion_mask, budget=budget)
    assert len(slices) > 1 and slices[0][0] == 0 and slices[-1][1] == len(text_rollout)
    for start, stop in slices:
        part = trim_padding(text_rollout.rows(start, stop))
        width = int(text_rollout.completion_mask[start:stop].sum(-1).max())
        assert part.completion_ids.shape[1] == width  # trailing padding columns are gone
        assert part.prompt_ids.shape[1] == int(text_rollout.prompt_mask[start:stop].sum(-1).max())
        got = policy.logprobs(part).detach()
        mask = part.completion_mask
        torch.testing.assert_close(got[mask], full[start:stop, :width][mask], atol=1e-5, rtol=0)
        torch.testing.assert_close(part.logprobs, text_rollout.logprobs[start:stop, :width], atol=0, rtol=0)


# ---------------------------------------------------------------------------------------------- checkpointing
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(tiny_policy, text_rollout):
    policy = tiny_policy("qwen2_5_vl", seed=0)
    policy.model.train()
    # transformers checkpoints a block's `forward` (hooks on the block itself stay outside); a module inside the
    # block runs again in the backward pass when the block is checkpointed. A pre-hook: torch stops the
    # recomputation as soon as the last saved tensor is rebuilt, inside the MLP, before any forward hook fires.
    inside = policy.model.model.language_model.layers[0].mlp
    calls = []
    inside.register_forward_pre_hook(lambda *_: calls.append(1))

    def loss_and_grads():
        policy.model.zero_grad(set_to_none=True)
        calls.clear()
        loss = loss_of(policy, text_rollout)
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.grad is not None}

    plain_loss, plain_grads = loss_and_grads()
    assert len(calls) == 1
    enable_gradient_checkpointing(policy)
    loss, grads = loss_and_grads()
    assert len(calls) == 2, "the checkpointed layer should run again in the backward pass"
    torch.testing.assert_close(loss, plain_loss, atol=1e-6, rtol=0)
    assert grads.keys() == plain_grads.keys() and any(".visual." in n for n in grads)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-6, rtol=1e-4, msg=name)


# ---------------------------------------------------------------------------------------------- frozen vision
@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_vl"])
def test_vision_tower_is_found_with_its_merger(arch, tiny_policy):
    policy = tiny_policy(arch, seed=0)
    found = find_vision_modules(policy.model)
    assert list(found) == ["model.visual"]  # the merger (and Qwen3-VL's deepstack mergers) live inside it
    assert any(n.startswith("merger") for n, _ in found["model.visual"].named_modules())
    with pytest.raises(ValueError, match="no vision tower found in Linear"):
        find_vision_modules(torch.nn.Linear(2, 2))


def test_frozen_vision_tower_gets_no_gradient_and_does_not_move(tiny_policy, text_rollout):
    policy = tiny_policy("qwen2_5_vl", seed=0)
    assert freeze_vision(policy) == ["model.visual"]
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2, weight_decay=0.1)
    policy.model.train()
    loss_of(policy, text_rollout).backward()
    optimizer.step()
    vision = {n for n in before if n.startswith("model.visual.")}
    assert vision and all(policy.model.get_parameter(n).grad is None for n in vision)
    assert all(torch.equal(policy.model.get_parameter(n), before[n]) for n in vision)
    moved = [n for n in before if n not in vision and not torch.equal(policy.model.get_parameter(n), before[n])]
    assert any(".language_model.layers." in n for n in moved)


# ---------------------------------------------------------------------------------------------- LoRA
@pytest.fixture(scope="module")
def trained_lora_vla(tiny_policy, grounding_obs):
    """(policy before LoRA, LoRA policy after 2 AdamW steps, VLA rollout, action token ids)."""
    policy, action_ids = vla(tiny_policy)
    plain = copy.deepcopy(policy)
    apply_lora(policy, r=4, alpha=8, dropout=0.0)
    torch.manual_seed(0)
    rollout = policy.generate(grounding_obs("qwen2_5_vl", [0, 0, 1, 1]), group_size=2, sampling=SAMPLING)
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-2)
    policy.model.train()
    for _ in range(2):
        optimizer.zero_grad()
        loss_of(policy, rollout).backward()
        optimizer.step()
    policy.model.eval()
    return plain, policy, rollout, action_ids


def test_lora_trains_only_adapters_and_the_action_token_rows(trained_lora_vla):
    plain, policy, rollout, action_ids = trained_lora_vla
    assert torch.isin(rollout.completion_ids, action_ids).all()  # generation stays restricted under LoRA
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    adapters = [n for n in trainable if ".lora_A." in n or ".lora_B." in n]
    assert adapters and all(".language_model." in n for n in adapters)  # not the vision tower, not lm_head
    assert {n for n in trainable if n not in adapters} == {
        "base_model.model.model.language_model.embed_tokens.token_adapter.trainable_tokens_delta.default"
    }
    # The effective weights: adapters changed the language model; of the embedding only the action rows moved.
    before, after = plain.model.state_dict(), dict(merged_named_weights(policy.model))
    embed = "model.language_model.embed_tokens.weight"
    changed_rows = (after[embed] != before[embed]).any(-1).nonzero().squeeze(-1)
    assert set(changed_rows.tolist()) <= set(action_ids.tolist()) and changed_rows.numel() > 0
    assert "lm_head.weight" not in after  # tied: the head is the embedding, listed once
    q_proj = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(after[q_proj], before[q_proj])
    assert all(torch.equal(after[n], before[n]) for n in before if n.startswith("model.visual."))


def test_merged_lora_gives_the_adapted_logprobs_and_the_sync_weights(trained_lora_vla):
    _, policy, rollout, _ = trained_lora_vla
    adapted = policy.logprobs(rollout).detach()
    synced = {n: w.detach().clone() for n, w in merged_named_weights(policy.model)}  # what vLLM would receive
    merged = merge_lora(copy.deepcopy(policy))
    assert not is_lora(merged) and type(merged.model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    assert merged.model.lm_head.weight is merged.model.get_input_embeddings().weight  # still tied
    torch.testing.assert_close(merged.logprobs(rollout).detach(), adapted, atol=1e-5, rtol=0)
    state = dict(merged.model.named_parameters())  # what the plain model would send
    assert synced.keys() == state.keys()
    for name, tensor in state.items():
        torch.testing.assert_close(synced[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_lora_checkpoint_round_trip(trained_lora_vla, tmp_path):
    plain, policy, rollout, _ = trained_lora_vla
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = VLMPolicy.from_pretrained(tmp_path / "ckpt", prompt_template=policy.prompt_template)
    assert is_lora(loaded) and loaded.action_codec is not None
    trainable = lambda p: {n: w for n, w in p.model.named_parameters() if w.requires_grad}  # noqa: E731
    assert trainable(loaded).keys() == trainable(policy).keys()
    for name, weight in trainable(loaded).items():
        torch.testing.assert_close(weight, trainable(policy)[name], atol=0, rtol=0)
    torch.testing.assert_close(loaded.logprobs(rollout).detach(), policy.logprobs(rollout).detach(), atol=1e-6, rtol=0)
    # The top level is a plain checkpoint of the unmerged base weights, loadable without PEFT.
    base = AutoModelForImageTextToText.from_pretrained(tmp_path / "ckpt")
    want = base_state_dict(policy.model)
    assert base.state_dict().keys() == want.keys() == plain.model.state_dict().keys()
    assert all(torch.equal(base.state_dict()[n], want[n]) for n in want)
    # Export: merged, saved, loaded by from_pretrained as a plain policy with the adapted log-probs.
    merge_lora(loaded).save_pretrained(tmp_path / "export")
    exported = VLMPolicy.from_pretrained(tmp_path / "export", prompt_template=policy.prompt_template)
    assert not is_lora(exported) and not (tmp_path / "export" / "lora").exists()
    torch.testing.assert_close(
        exported.logprobs(rollout).detach(), policy.logprobs(rollout).detach(), atol=1e-5, rtol=0
    )


def test_lora_on_an_untied_head_trains_its_action_rows_too(grounding_obs):
    from transformers import AutoConfig

    from mmrl.policy.vlm.tiny import ASSETS, tiny_processor

    config = AutoConfig.from_pretrained(ASSETS / "tiny_models" / "qwen2_vl")
    config.tie_word_embeddings = config.text_config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    policy = VLMPolicy(model, tiny_processor("qwen2_vl"), prompt_template="{image} {instruction}")
    assert model.lm_head.weight is not model.get_input_embeddings().weight
    codec = add_action_tokens(policy, torch.full((2,), -1.0), torch.ones(2), bins=8)
    apply_lora(policy, r=2)
    rows = {n for n, p in policy.model.named_parameters() if p.requires_grad and "lora_" not in n}
    assert {n.split(".")[-4] for n in rows} == {"embed_tokens", "lm_head"}
    head_before = policy.model.get_base_model().lm_head.token_adapter.base_layer.weight.detach().clone()
    torch.manual_seed(0)
    rollout = policy.generate(grounding_obs("qwen2_vl", [0, 0]), group_size=2, sampling=SAMPLING)
    optimizer = torch.optim.AdamW([p for p in policy.model.parameters() if p.requires_grad], lr=1e-2)
    loss_of(policy, rollout).backward()
    optimizer.step()
    head = dict(merged_named_weights(policy.model))["lm_head.weight"]
    changed = (head != head_before).any(-1).nonzero().squeeze(-1)
    assert changed.numel() > 0 and set(changed.tolist()) <= set(codec.token_ids.tolist())


def test_lora_adapters_start_from_their_seed_whatever_the_process_drew_before(tiny_policy):
    """PEFT draws lora_A from the global generator; unseeded, two processes (a torchrun worker, a pytest process)
    started equal runs from different adapters: equal first losses (B = 0), different first gradients."""

    def adapters(seed: int, drawn_before: int) -> dict[str, torch.Tensor]:
        policy = tiny_policy("qwen2_vl", seed=0)
        torch.manual_seed(drawn_before)
        torch.rand(drawn_before + 1)  # whatever the process did before
        state = torch.get_rng_state()
        apply_lora(policy, r=2, seed=seed)
        assert torch.equal(torch.get_rng_state(), state)  # the global generator is left as it was
        return {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_A" in n}

    first, again, other = adapters(3, drawn_before=0), adapters(3, drawn_before=5), adapters(4, drawn_before=0)
    assert first and first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[n], again[n]) for n in first)
    assert all(not torch.equal(first[n], other[n]) for n in first)


def test_lora_with_gradient_checkpointing_gives_the_same_gradients(tiny_policy, text_rollout):
    policy = tiny_policy("qwen2_5_vl", seed=0)
    apply_lora(policy, r=4, alpha=8, target_modules="q_proj, v_proj")
    policy.model.train()
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert names and all(("q_proj" in n or "v_proj" in n) and ".visual." not in n for n in names)
    with torch.no_grad():  # B = 0 at init gives zero gradients for A; make both non-trivial
        for n, p in policy.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(0))
    loss_of(policy, text_rollout).backward()
    plain = {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    policy.model.zero_grad(set_to_none=True)
    enable_gradient_checkpointing(policy)
    loss_of(policy, text_rollout).backward()
    for n, p in policy.model.named_parameters():
        if p.requires_grad:
            assert plain[n].abs().sum() > 0
            torch.testing.assert_close(p.grad, plain[n], atol=1e-6, rtol=1e-4, msg=n)


def test_apply_model_options_is_idempotent_and_sets_the_backend(tiny_policy):
    policy, _ = vla(tiny_policy, "qwen2_vl")
    lora = LoRAConfig(r=2)
    cfg = ModelConfig(gradient_checkpointing=True, freeze_vision=True, lora=lora, generation_backend="static")
    apply_model_options(policy, cfg)
    first = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    apply_model_options(policy, cfg)  # e.g. on a policy resumed from a LoRA checkpoint: no second adapter set
    assert [n for n, p in policy.model.named_parameters() if p.requires_grad] == first
    assert is_lora(policy) and policy.generation_backend == "static"
    assert policy.model.get_base_model().model.language_model.gradient_checkpointing


def test_the_engine_memory_share_reaches_the_engine_process_too(tiny_policy):
    # `model.vllm_gpu_memory_utilization` is the engine's share on either route: the engine process's child engine
    # takes it from the backend's options (nothing starts until the first sample).
    policy = tiny_policy("qwen2_vl")
    apply_model_options(policy, ModelConfig(generation_backend="vllm_process", vllm_gpu_memory_utilization=0.5))
    assert policy.generation_backend == "vllm_process"
    assert policy.backend.engine_options["gpu_memory_utilization"] == 0.5
    with pytest.raises(ConfigError, match=r"model.vllm_gpu_memory_utilization must be in \(0, 1\)"):
        ModelConfig(vllm_gpu_memory_utilization=1.0)  # what the engine refuses is refused at load


def test_lora_without_peft_names_the_extra(tiny_policy, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # what an install without the extra looks like to `import`
    with pytest.raises(ImportError, match=r"mmrl\[lora\]"):
        apply_lora(tiny_policy("qwen2_vl"), r=2)
