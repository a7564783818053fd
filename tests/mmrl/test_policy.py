"""VLMPolicy on the three tiny real architectures: sampling-time log-probs, padding, groups, masks, checkpoints.

The reference for every log-prob is one plain forward pass of the Hugging Face model written out in this file,
so a bug shared by `VLMPolicy.generate` and `VLMPolicy.logprobs` still shows.
"""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

from mmrl.policy import TINY_ARCHS, Rollout, Sampling, VLMPolicy, completion_mask_from_ids
from mmrl.types import _spans
from sim.base import Observation

TEMPERATURE = 0.7
SAMPLING = Sampling(max_new_tokens=8, temperature=TEMPERATURE)
ATOL = 1e-4


def reference_logits(policy: VLMPolicy, rollout: Rollout) -> torch.Tensor:
    """`[R, L, V]` logits that predict the completion tokens, from one forward pass over prompt + completion."""
    model = policy.model
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)  # [R, P+L]
    attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1).long()
    inputs = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "pixel_values": rollout.pixel_values,
        "image_grid_thw": rollout.image_grid_thw,
    }
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        inputs["mm_token_type_ids"] = (input_ids == model.config.image_token_id).int()
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits.float()  # [R, P+L, V]
    prompt_len = rollout.prompt_ids.shape[1]
    return logits[:, prompt_len - 1 : -1]  # position t predicts token t+1


def reference_logprobs(policy: VLMPolicy, rollout: Rollout, temperature: float) -> torch.Tensor:
    """`[R, L]` log-probs of the completion tokens under softmax(logits / temperature)."""
    logits = reference_logits(policy, rollout) / temperature
    return logits.log_softmax(-1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)


def boost_logits(policy: VLMPolicy, token_ids: list[int], amount: float) -> None:
    """Add `amount` to the logits of `token_ids`, in generation and in forward passes alike."""
    bias = torch.zeros(policy.model.config.text_config.vocab_size)
    bias[token_ids] = amount
    policy.model.lm_head.register_forward_hook(lambda module, args, out: out + bias)


def assert_close_on(mask: torch.Tensor, got: torch.Tensor, want: torch.Tensor, atol: float = ATOL) -> None:
    torch.testing.assert_close(got[mask], want[mask], atol=atol, rtol=0)


@pytest.fixture(scope="module", params=[(arch, views) for views in (1, 2) for arch in TINY_ARCHS],
                ids=lambda p: f"{p[0]}-{p[1]}view")  # fmt: skip
def sampled(request, tiny_policy, grounding_obs):
    """(arch, policy, rollout): B=2 prompts x G=2 samples x 8 tokens, EOS made likely so some rows end early.

    With the EOS logit raised by 3, rows end at different lengths (some run to the limit) and the rest of each row
    is right padding, which every comparison below has to get right. (The sampler's draws decide the lengths; the
    first of ten seeds that gives both kinds of rows is used.) With 2 views, each world shows two images (`[N, 2,
    H, W, 3]`, a second scene as the second camera), so every test below also runs with 2 images per row.
    """
    arch, views = request.param
    policy = tiny_policy(arch, seed=0)
    boost_logits(policy, policy.eos_token_ids, 3.0)
    obs = grounding_obs(arch, [0, 0, 1, 1])
    if views == 2:
        second = grounding_obs(arch, [7, 7, 8, 8]).image
        obs = Observation(image=torch.stack([obs.image, second], dim=1), instruction=obs.instruction)
    for seed in range(10):  # the first seed whose draw has rows of different lengths
        torch.manual_seed(seed)
        rollout = policy.generate(obs, group_size=2, sampling=SAMPLING)
        lengths = rollout.completion_mask.sum(-1)
        if (lengths < rollout.completion_ids.shape[1]).any() and (lengths == rollout.completion_ids.shape[1]).any():
            return arch, policy, rollout
    raise AssertionError("no seed made rows of different lengths: the fixture tests no padding")


def test_sampling_logprobs_equal_a_plain_forward_pass(sampled):
    _, policy, rollout = sampled
    want = reference_logprobs(policy, rollout, TEMPERATURE)
    mask = rollout.completion_mask
    assert_close_on(mask, rollout.logprobs, want)
    assert (rollout.logprobs[~mask] == 0).all()  # the documented contract: 0 where masked


def test_recomputed_logprobs_equal_a_plain_forward_pass(sampled):
    _, policy, rollout = sampled
    got = policy.logprobs(rollout, temperature=TEMPERATURE)
    assert got.requires_grad  # the trainer differentiates these
    assert_close_on(rollout.completion_mask, got.detach(), reference_logprobs(policy, rollout, TEMPERATURE))


def test_shared_images_are_encoded_once_with_the_same_gradients(sampled):
    arch, policy, rollout = sampled
    model = policy.model
    patches_seen = []
    hook = model.model.visual.register_forward_hook(lambda m, args, out: patches_seen.append(args[0].shape[0]))
    try:
        model.zero_grad()
        policy.logprobs(rollout, temperature=TEMPERATURE).masked_fill(~rollout.completion_mask, 0).sum().backward()
    finally:
        hook.remove()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    # The plain forward pass (every row's image through the vision tower), differentiated the same way.
    model.zero_grad()
    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    inputs = {
        "input_ids": input_ids,
        "attention_mask": torch.cat([rollout.prompt_mask, rollout.completion_mask], dim=1).long(),
        "pixel_values": rollout.pixel_values,
        "image_grid_thw": rollout.image_grid_thw,
    }
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        inputs["mm_token_type_ids"] = (input_ids == model.config.image_token_id).int()
    logits = model(**inputs, use_cache=False).logits.float()[:, rollout.prompt_ids.shape[1] - 1 : -1] / TEMPERATURE
    want_lp = logits.log_softmax(-1).gather(-1, rollout.completion_ids.unsqueeze(-1)).squeeze(-1)
    want_lp.masked_fill(~rollout.completion_mask, 0).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    assert got.keys() == want.keys() and any("visual" in n for n in got)
    for name in want:
        # atol 1e-6 in units of the tensor's largest entry (at least 1): the embedding's gradient reaches 12, where
        # float32 resolves about 1e-6, and the two paths sum its rows' contributions in another order (one entry of
        # 262,144 was 1.5e-6 apart with transformers 5.24, 1.3e-7 of the largest).
        scale = max(1.0, want[name].abs().max().item())
        torch.testing.assert_close(
            got[name], want[name], rtol=1e-4, atol=1e-6 * scale, msg=lambda m, n=name: f"{n}: {m}"
        )
    total = int(rollout.image_grid_thw.prod(-1).sum())
    if arch == "qwen3_vl":  # deepstack features enter later layers: the model's own path, every row's image
        assert patches_seen == [total]
    else:  # 2 prompts x 2 rows: the two distinct images only
        assert patches_seen == [total // 2]


def test_every_view_of_a_world_is_seen(sampled):
    arch, policy, rollout = sampled
    if rollout.images_per_row == 1:
        pytest.skip("one view")
    assert rollout.image_grid_thw.shape[0] == 2 * len(rollout)
    # Blacken the second view of every row: the same completions then score differently.
    per_image = rollout.image_grid_thw.prod(-1)
    second = torch.arange(len(per_image)) % 2 == 1
    rows = second.repeat_interleave(per_image)
    dark = replace(
        rollout, pixel_values=torch.where(rows.unsqueeze(-1), rollout.pixel_values.min(), rollout.pixel_values)
    )
    mask = rollout.completion_mask
    assert not torch.allclose(reference_logprobs(policy, dark, TEMPERATURE)[mask], rollout.logprobs[mask], atol=ATOL)


def test_rows_is_a_self_contained_slice(sampled):
    _, policy, rollout = sampled
    full = policy.logprobs(rollout, temperature=TEMPERATURE).detach()
    # Rows 1..2 straddle the two groups, so the slice needs the second image's patches, not the first's twice.
    part = rollout.rows(1, 3)
    assert len(part) == 2 and part.texts == rollout.texts[1:3]
    got = policy.logprobs(part, temperature=TEMPERATURE).detach()
    assert_close_on(part.completion_mask, got, full[1:3])
    assert_close_on(part.completion_mask, part.logprobs, rollout.logprobs[1:3])


def test_rows_of_a_group_share_prompt_and_image_but_not_completions(sampled):
    _, _, rollout = sampled
    group_size, per_row = rollout.group_size, rollout.images_per_row
    patches = rollout.image_grid_thw.prod(-1).tolist()
    chunks = rollout.pixel_values.split(patches)  # one chunk per image
    images = [torch.cat(chunks[r * per_row : (r + 1) * per_row]) for r in range(len(rollout))]  # one per row
    assert len(chunks) == per_row * len(rollout)
    for g in range(len(rollout) // group_size):
        rows = range(g * group_size, (g + 1) * group_size)
        for r in rows:
            torch.testing.assert_close(rollout.prompt_ids[r], rollout.prompt_ids[rows[0]], rtol=0, atol=0)
            torch.testing.assert_close(rollout.prompt_mask[r], rollout.prompt_mask[rows[0]], rtol=0, atol=0)
            torch.testing.assert_close(images[r], images[rows[0]], rtol=0, atol=0)
        completions = {tuple(rollout.completion_ids[r].tolist()) for r in rows}
        assert len(completions) > 1, f"group {g}: every sample at temperature {TEMPERATURE} is the same"
    assert not torch.equal(images[0], images[group_size])  # the two groups hold different scenes


def test_padding_after_eos_holds_pad_tokens_and_no_text(sampled):
    _, policy, rollout = sampled
    eos = policy.eos_token_ids
    for r in range(len(rollout)):
        ids, mask = rollout.completion_ids[r], rollout.completion_mask[r]
        n = int(mask.sum())
        assert mask[:n].all() and not mask[n:].any()  # True then False
        if n < len(ids):
            assert ids[n - 1].item() in eos  # the last kept token is the EOS
            assert (ids[n:] == policy.pad_token_id).all()
        assert not any(t in eos for t in ids[: n - 1].tolist())  # no EOS before the last kept token
    assert rollout.texts == policy.processor.tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)


def test_generate_refuses_worlds_that_do_not_split_into_groups(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    with pytest.raises(ValueError, match="groups of 2"):
        policy.generate(grounding_obs("qwen2_vl", [0, 0, 1]), group_size=2, sampling=SAMPLING)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_left_padding_does_not_change_logprobs(arch, tiny_policy, grounding_obs):
    policy = tiny_policy(arch, seed=0)
    instructions = ["Find it.", "Find the yellow triangle just left of the large blue square, then draw its box."]
    obs = grounding_obs(arch, [3, 4], instructions)
    torch.manual_seed(0)
    batch = policy.generate(obs, group_size=1, sampling=SAMPLING)
    assert not batch.prompt_mask[0].all() and batch.prompt_mask[1].all(), "row 0 should be the left-padded one"
    batch_logprobs = policy.logprobs(batch, temperature=TEMPERATURE).detach()
    for i in range(2):
        alone_inputs = policy.encode(obs.select([i]))
        alone = replace(
            batch.rows(i, i + 1),
            prompt_ids=alone_inputs["input_ids"],
            prompt_mask=alone_inputs["attention_mask"].bool(),
        )
        mask = alone.completion_mask
        want = policy.logprobs(alone, temperature=TEMPERATURE).detach()
        assert_close_on(mask, batch.logprobs[i : i + 1], want)  # sampled in a padded batch
        assert_close_on(mask, batch_logprobs[i : i + 1], want)  # recomputed in a padded batch


def test_what_the_left_padding_holds_does_not_matter(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    obs = grounding_obs("qwen2_vl", [3, 4], ["Find it.", "Find the yellow triangle left of the blue square."])
    torch.manual_seed(0)
    batch = policy.generate(obs, group_size=1, sampling=SAMPLING)
    pad = ~batch.prompt_mask
    assert pad.any()
    garbage = torch.where(pad, torch.full_like(batch.prompt_ids, 1000), batch.prompt_ids)  # 1000: an ordinary token
    dirty = replace(batch, prompt_ids=garbage)
    clean_logprobs = policy.logprobs(batch, temperature=TEMPERATURE).detach()
    assert_close_on(batch.completion_mask, policy.logprobs(dirty, temperature=TEMPERATURE).detach(), clean_logprobs)


def test_completion_mask_keeps_tokens_up_to_and_including_the_first_eos():
    ids = torch.tensor(
        [
            [5, 2, 7, 2],  # EOS second: keep 2, drop what follows (a second EOS too)
            [5, 6, 7, 8],  # no EOS: keep all
            [2, 0, 0, 0],  # EOS first
            [5, 6, 7, 3],  # the other EOS id, last
        ]
    )
    want = torch.tensor(
        [
            [True, True, False, False],
            [True, True, True, True],
            [True, False, False, False],
            [True, True, True, True],
        ]
    )
    torch.testing.assert_close(completion_mask_from_ids(ids, [2, 3]), want)
    assert completion_mask_from_ids(ids, [2])[3].all()


def test_vision_placeholder_tokens_are_never_generated(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    placeholders = policy.suppress_token_ids
    config = policy.model.config
    assert {config.image_token_id, config.video_token_id, config.vision_start_token_id} <= set(placeholders)
    boost_logits(policy, placeholders, 30.0)  # without suppression the model would sample nothing else
    obs = grounding_obs("qwen2_vl", [0, 1])
    torch.manual_seed(0)
    rollout = policy.generate(obs, group_size=1, sampling=Sampling(max_new_tokens=4, temperature=1.0))
    assert not torch.isin(rollout.completion_ids, torch.tensor(placeholders)).any()
    # The control: the boost does make placeholders win once suppression is off.
    policy.suppress_token_ids = []
    rollout = policy.generate(obs, group_size=1, sampling=Sampling(max_new_tokens=4, temperature=1.0))
    assert torch.isin(rollout.completion_ids, torch.tensor(placeholders)).all()


def test_a_prompt_longer_than_the_context_is_refused_never_cut(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    obs = grounding_obs("qwen2_vl", [0, 1])
    length = policy.encode(obs)["input_ids"].shape[1]
    config = policy.model.config.text_config
    limit = config.max_position_embeddings
    try:
        config.max_position_embeddings = length - 1
        with pytest.raises(ValueError, match=rf"a prompt of {length} tokens .* longer than the model's context of "
                                             rf"{length - 1}; lower model.max_pixels"):  # fmt: skip
            policy.generate(obs)
    finally:
        config.max_position_embeddings = limit


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_saved_policy_loads_back_with_identical_logprobs(arch, tmp_path, tiny_policy, grounding_obs):
    policy = tiny_policy(arch, seed=0)
    policy.save_pretrained(tmp_path)
    loaded = VLMPolicy.from_pretrained(tmp_path, prompt_template=policy.prompt_template)
    assert type(loaded.model) is type(policy.model)
    assert loaded.eos_token_ids == policy.eos_token_ids and loaded.pad_token_id == policy.pad_token_id
    assert loaded.suppress_token_ids == policy.suppress_token_ids
    obs = grounding_obs(arch, [5, 6])
    want_inputs, got_inputs = policy.encode(obs), loaded.encode(obs)  # the processor round-trips too
    assert want_inputs.keys() == got_inputs.keys()
    for key in want_inputs:
        torch.testing.assert_close(got_inputs[key], want_inputs[key], rtol=0, atol=0)
    torch.manual_seed(0)
    rollout = policy.generate(obs, group_size=1, sampling=SAMPLING)
    want = policy.logprobs(rollout, temperature=TEMPERATURE).detach()
    got = loaded.logprobs(rollout, temperature=TEMPERATURE).detach()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_the_tiny_folders_carry_their_familys_released_chat_template(arch):
    """scripts/make_assets.py writes the released templates; TRL keeps copies of them for identity comparison."""
    from importlib.resources import files

    from mmrl.policy.vlm.tiny import tiny_processor

    pytest.importorskip("trl")
    released = {"qwen2_vl": "qwen2_5_vl", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}[arch]  # 2 = 2.5
    processor = tiny_processor(arch)
    assert processor.tokenizer.chat_template == (files("trl") / "chat_templates" / f"{released}.jinja").read_text()
    # Qwen2-VL's and Qwen2.5-VL's open every chat with a default system turn; Qwen3-VL's with the user's turn.
    default = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    want = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Find it.<|im_end|>\n<|im_start|>assistant\n"
    assert processor.prompt_text("Find it.") == (want if arch == "qwen3_vl" else default + want)


def test_greedy_generation_is_deterministic(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    obs = grounding_obs("qwen2_vl", [7, 8])
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    torch.manual_seed(1)
    first = policy.generate(obs, group_size=1, sampling=greedy)
    torch.manual_seed(2)  # greedy decoding must not read the RNG
    second = policy.generate(obs, group_size=1, sampling=greedy)
    torch.testing.assert_close(second.completion_ids, first.completion_ids, rtol=0, atol=0)
    torch.testing.assert_close(second.logprobs, first.logprobs, rtol=0, atol=0)
    assert second.texts == first.texts
    # Greedy log-probs are those of the untempered distribution, and each greedy token is its position's argmax.
    mask = first.completion_mask
    assert_close_on(mask, first.logprobs, reference_logprobs(policy, first, 1.0))
    logits = reference_logits(policy, first)
    assert torch.equal(logits.argmax(-1)[mask], first.completion_ids[mask])


def test_sampling_follows_the_global_seed(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    obs = grounding_obs("qwen2_vl", [7, 8])
    draws = []
    for seed in (0, 0, 1):
        torch.manual_seed(seed)
        draws.append(policy.generate(obs, group_size=1, sampling=SAMPLING).completion_ids)
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


def test_spans_are_the_concatenated_ranges_of_each_start_and_count():
    """`_spans` (row selection's image and patch indices) against the plain loop, empty ranges included."""
    g = torch.Generator().manual_seed(0)
    for _ in range(100):
        n = int(torch.randint(1, 8, (1,), generator=g))
        starts, counts = torch.randint(0, 50, (n,), generator=g), torch.randint(0, 5, (n,), generator=g)
        ranges = [torch.arange(s, s + c) for s, c in zip(starts.tolist(), counts.tolist())]
        assert torch.equal(_spans(starts, counts), torch.cat(ranges))
