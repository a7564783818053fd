"""The vllm backend on vLLM's CPU build: what it samples is what the training forward scores, before and after an update.

Runs inside .venv-vllm (`make setup-vllm`), one engine per tiny architecture (Qwen2-VL, Qwen2.5-VL, Qwen3-VL), in
float32. For each: the sampled tokens' log-probs equal `VLMPolicy.logprobs`' rescoring of the same rollout, with one
and with two images per prompt; then one AdamW step changes every weight, and the next samples' log-probs equal the
*new* weights' rescoring (the sync reached the engine: the reloaded layers, the tied output head, and the image
features, which the encoder cache would otherwise serve from the old vision tower for the same images).

The reference is the training forward with the vision placeholders removed from the distribution. The backend bans
them (`logit_bias` -100: a sampled placeholder would break the next forward), and vLLM's processed log-probs are of
the distribution it samples from, i.e. renormalised without them: higher than the full-vocabulary
`VLMPolicy.logprobs` by `-log(1 - p_placeholders)`, about 2e-3 for a random tiny model (4 of 2048 tokens) and about
0 for a trained one. The test checks that relation too.

Tolerance 1e-4: both sides compute in float32 (vLLM's CPU attention and repacked linear kernels against
transformers' forward); their log-probs were seen to agree to about 1e-6, so 1e-4 leaves room for other CPUs' kernels
while staying 20x below the placeholder mass and far below what a missed sync gives (checked: stale weights score
the post-update samples more than 1e-2 away).
"""

from __future__ import annotations

import copy

import pytest
import torch

import sim
from mmrl.policy import TINY_ARCHS, build_tiny
from mmrl.stages.rollout import collect_episodes
from mmrl.types import Sampling
from sim.base import Observation

IMAGE_SIZE = {"qwen2_vl": 112, "qwen2_5_vl": 112, "qwen3_vl": 128}  # multiples of 28 px (Qwen2/2.5) and 32 (Qwen3)
SAMPLING = Sampling(max_new_tokens=8, temperature=0.9)
GROUP = 2
ATOL = 1e-4


def observations(arch: str, images: int) -> Observation:
    """Two grounding prompts, each repeated GROUP times (the group contract), with `images` views per world."""
    env = sim.make("grounding", num_envs=2 * images, image_size=IMAGE_SIZE[arch])
    obs = env.reset(seed=list(range(2 * images)))
    if images == 2:  # world i shows the images of seeds i and i + 2
        obs = Observation(image=torch.stack([obs.image[:2], obs.image[2:]], dim=1), instruction=obs.instruction[:2])
    return obs.select([i for i in range(2) for _ in range(GROUP)])


def scored(policy, rollout, banned: bool) -> torch.Tensor:
    """`VLMPolicy.logprobs` of `rollout` under the current weights (no gradient), over the whole vocabulary or, with
    `banned`, with the vision placeholders removed (the distribution vLLM samples from)."""
    if banned:
        ids = torch.tensor(policy.suppress_token_ids)
        policy._restrict = lambda logits: logits.index_fill(-1, ids.to(logits.device), float("-inf"))
    try:
        with torch.no_grad():
            return policy.logprobs(rollout, temperature=SAMPLING.temperature)
    finally:
        policy.__dict__.pop("_restrict", None)


def sample(policy, obs: Observation, seed: int = 0):
    torch.manual_seed(seed)
    return policy.generate(obs, group_size=GROUP, sampling=SAMPLING)


def assert_matches(policy, rollout) -> float:
    """The rollout's log-probs equal the training forward's (placeholders banned); returns the largest difference."""
    mask = rollout.completion_mask
    assert mask.any()
    want = scored(policy, rollout, banned=True)
    torch.testing.assert_close(rollout.logprobs[mask], want[mask], rtol=0, atol=ATOL)
    # Renormalising without the placeholders only raises every other token's log-prob.
    plain = scored(policy, rollout, banned=False)
    assert (rollout.logprobs[mask] >= plain[mask] - ATOL).all()
    return (rollout.logprobs[mask] - want[mask]).abs().max().item()


@pytest.fixture(scope="module", params=TINY_ARCHS)
def engine_policy(request):
    """A tiny policy of each architecture keeping one earlier turn in a conversation, with a vLLM engine (one engine
    each), which therefore admits two images per prompt from its first call of one image."""
    arch = request.param
    policy = build_tiny(arch, seed=0, prompt_template="{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>.")
    policy.history_turns = 1  # read by collect_episodes; generate without a history ignores it
    policy.set_generation_backend("vllm", max_model_len=1024, enforce_eager=True)
    yield arch, policy
    policy.backend.close()
    assert policy.backend.llm is None


@pytest.mark.parametrize("images", [1, 2])
def test_sampled_logprobs_equal_the_training_forward(engine_policy, images):
    arch, policy = engine_policy
    rollout = sample(policy, observations(arch, images))
    assert policy.backend._limit == 2  # built at the first call (one image) for conversations of two turns
    assert rollout.completion_ids.shape[0] == 2 * GROUP
    assert rollout.images_per_row == images
    banned = torch.tensor(policy.suppress_token_ids)
    assert not torch.isin(rollout.completion_ids[rollout.completion_mask], banned).any()
    print(f"{arch}, {images} image(s): max |vLLM - forward| = {assert_matches(policy, rollout):.2e}")


def test_the_same_torch_seed_samples_the_same_completions(engine_policy):
    arch, policy = engine_policy
    obs = observations(arch, 1)
    first, again, other = sample(policy, obs, seed=3), sample(policy, obs, seed=3), sample(policy, obs, seed=4)
    assert first.completion_ids.tolist() == again.completion_ids.tolist()
    assert first.completion_ids.tolist() != other.completion_ids.tolist()
    # The G samples of a prompt are drawn with distinct seeds, and prompt 1's never reuse prompt 0's.
    rows = [tuple(r) for r in first.completion_ids.tolist()]
    assert len(set(rows)) == len(rows)


def test_an_optimiser_step_reaches_the_engine(engine_policy):
    arch, policy = engine_policy
    obs = observations(arch, 2)  # image prompts already seen: stale encoder-cache entries would be hit
    rollout = sample(policy, obs)
    before = copy.deepcopy(policy)  # the weights that sampled `rollout` (the copy has no engine)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    logprobs = policy.logprobs(rollout, temperature=SAMPLING.temperature)
    mask = rollout.completion_mask
    (-(logprobs * mask).sum() / mask.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()

    after = sample(policy, obs, seed=1)
    diff = assert_matches(policy, after)
    stale = scored(before, after, banned=True)
    gap = (stale[after.completion_mask] - after.logprobs[after.completion_mask]).abs().max().item()
    assert gap > 100 * ATOL, f"the update moved the log-probs by only {gap:.1e}: the test would not see a missed sync"
    print(f"{arch}: after one AdamW step max |vLLM - forward| = {diff:.2e}, old weights off by {gap:.2e}")


def test_a_conversation_reaches_the_engine_as_the_training_prompt_token_for_token(engine_policy):
    """Two-turn episodes of a real multi-turn env (`model.history_turns` 1): the second turn's prompt holds the first
    turn's image and sampled tokens. vLLM gets the training prompt's ids (each image's placeholders collapsed to one,
    which it expands again from the image); the ids it ran on are exactly `Rollout.prompt_ids`, and the sampled
    log-probs are the training forward's on those rows (two images at their places, the earlier answer as prompt)."""
    arch, policy = engine_policy
    ran_on = []  # every row's prompt ids as the engine expanded them
    run = policy.backend._run

    def recording(requests, params):
        outputs = run(requests, params)
        ran_on.extend(list(o.prompt_token_ids) for o in outputs)
        return outputs

    policy.backend._run = recording
    try:
        env = sim.make("gui_task", num_envs=4, image_size=IMAGE_SIZE[arch], max_episode_steps=2)
        torch.manual_seed(0)
        episodes = collect_episodes(policy, env, [5, 5, 6, 6], group_size=GROUP, sampling=SAMPLING, max_turns=2)
    finally:
        policy.backend._run = run
    rollout, world, turn = episodes.rollout, episodes.world, episodes.turn
    later = (turn == 1).nonzero().squeeze(-1).tolist()
    assert later, "every episode ended after one turn: no conversation formed"
    prompts = [ids[mask].tolist() for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]
    # A group's G rows share the one prompt the engine ran: the same set, no re-tokenisation, no other expansion.
    assert set(map(tuple, ran_on)) == set(map(tuple, prompts))
    counts = rollout.image_counts()
    for r in later:
        first = next(i for i in range(len(turn)) if world[i] == world[r] and turn[i] == 0)
        answer = rollout.completion_ids[first][rollout.completion_mask[first]].tolist()
        assert counts[r] == 2 and any(prompts[r][k : k + len(answer)] == answer for k in range(len(prompts[r])))
    print(f"{arch}, two-turn conversations: max |vLLM - forward| = {assert_matches(policy, rollout):.2e}")


def test_a_call_larger_than_one_scheduler_step_samples_unseeded_and_says_so():
    """vLLM's CPU sampler fails a seeded batch whose prefill is split across scheduler steps ("CPU Generator does not
    use offset", seen with this engine and the seeds forced); the backend samples such a call unseeded, with a
    warning, and its log-probs are still the training forward's."""
    policy = build_tiny("qwen2_vl", seed=0, prompt_template="{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>.")
    # 128 tokens a step: two of the 68-token prompts do not fit one.
    policy.set_generation_backend(
        "vllm", max_model_len=1024, enforce_eager=True, max_num_batched_tokens=128, max_num_seqs=16
    )
    with pytest.warns(UserWarning, match="does not fit one scheduler step"):
        rollout = sample(policy, observations("qwen2_vl", 1))
    assert_matches(policy, rollout)
    policy.backend.close()


def test_bad_engine_options_name_the_backend():
    with pytest.raises(ValueError, match="no sleep mode on this platform"):
        build_tiny("qwen2_vl").set_generation_backend("vllm", enable_sleep_mode=True)
    policy = build_tiny("qwen2_vl")
    policy.set_generation_backend("vllm", max_model_len=1024, max_num_batched_tokens=64, max_num_seqs=128)
    with pytest.raises(RuntimeError, match="generation_backend='vllm': the vLLM engine did not start"):
        sample(policy, observations("qwen2_vl", 1))
