"""Generation backends: the static-cache backend against the `hf` reference, and the pure parts of the vLLM one.

On CPU the static backend runs without compilation (transformers compiles the decoding step on CUDA only; see
`mmrl.policy.engines.backends`), so these tests pin what must not change when it is compiled: the same tokens and the
same sampling-time log-probs as `hf`. vLLM lives in its own environment (`.venv-vllm`), where tests/vllm runs its
engines (on the CPU build, and on a GPU with `-m gpu`); only the vLLM backend's pure functions run here.
"""

from __future__ import annotations

import importlib.util
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from mmrl.policy import TINY_ARCHS, Sampling, VLMPolicy, add_action_tokens
from mmrl.policy.engines.backends import StaticCacheBackend
from mmrl.policy.engines.vllm_prompts import completions_from_vllm, sampling_params_kwargs, vllm_requests
from sim.base import Observation

HAS_VLLM = importlib.util.find_spec("vllm") is not None
SAMPLING = Sampling(max_new_tokens=8, temperature=0.7)


def generate(policy: VLMPolicy, backend: str, obs, group_size: int, sampling: Sampling, seed: int = 0):
    policy.generation_backend = backend
    torch.manual_seed(seed)
    return policy.generate(obs, group_size=group_size, sampling=sampling)


def cache_types(policy: VLMPolicy) -> set[str]:
    """Records the KV-cache class every forward pass of the policy's model uses, from now on.

    Read from the forward's output: transformers >= 5.24 lets the model build its dynamic cache itself (the first
    forward receives `past_key_values=None`), so the input alone no longer tells which cache decoding used.
    """
    seen: set[str] = set()

    def record(module, args, kwargs, output):
        seen.add(type(getattr(output, "past_key_values", None) or kwargs.get("past_key_values")).__name__)

    policy.model.register_forward_hook(record, with_kwargs=True)
    return seen


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_static_cache_gives_the_hf_tokens_and_logprobs(arch, tiny_policy, grounding_obs):
    policy = tiny_policy(arch, seed=0)
    caches = cache_types(policy)
    obs = grounding_obs(arch, [0, 1], ["Find it.", "Find the yellow triangle left of the blue square."])  # padded
    for sampling, group_size in ((Sampling(max_new_tokens=8, temperature=0.0), 1), (SAMPLING, 2)):
        obs_g = obs.select([i for i in range(len(obs)) for _ in range(group_size)])
        caches.clear()
        want = generate(policy, "hf", obs_g, group_size, sampling)
        assert caches == {"DynamicCache"}
        caches.clear()
        got = generate(policy, "static", obs_g, group_size, sampling)
        assert policy.generation_backend == "static" and caches == {"StaticCache"}  # the backend is really in use
        torch.testing.assert_close(got.completion_ids, want.completion_ids, rtol=0, atol=0)
        torch.testing.assert_close(got.completion_mask, want.completion_mask, rtol=0, atol=0)
        torch.testing.assert_close(got.logprobs, want.logprobs, rtol=0, atol=1e-5)
        assert got.texts == want.texts
        # Both agree with a recomputation by the training forward pass (the PPO ratio starts at 1).
        recomputed = policy.logprobs(got, temperature=sampling.temperature)  # <= 0 (greedy) scores at 1
        mask = got.completion_mask
        torch.testing.assert_close(got.logprobs[mask], recomputed.detach()[mask], rtol=0, atol=1e-4)


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_lean_loop_gives_the_hf_greedy_tokens_and_the_training_logprobs(arch, tiny_policy, grounding_obs):
    policy = tiny_policy(arch, seed=0)
    obs = grounding_obs(arch, [0, 1], ["Find it.", "Find the yellow triangle left of the blue square."])  # padded
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    want = generate(policy, "hf", obs, 1, greedy)
    got = generate(policy, "lean", obs, 1, greedy)
    assert policy.generation_backend == "lean"
    torch.testing.assert_close(got.completion_ids, want.completion_ids, rtol=0, atol=0)
    torch.testing.assert_close(got.completion_mask, want.completion_mask, rtol=0, atol=0)
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=0, atol=1e-5)
    # Sampled groups (the cache of each prompt repeated G times): the recorded log-probs are the ones the training
    # forward pass computes for the same tokens, so the positions after the prompt and the cache copies are right.
    for sampling in (SAMPLING, Sampling(max_new_tokens=8, temperature=1.3, top_k=50, top_p=0.9)):
        obs_g = obs.select([0, 0, 0, 1, 1, 1])
        got = generate(policy, "lean", obs_g, 3, sampling, seed=1)
        mask = got.completion_mask
        assert mask[:, 0].all() and len(set(got.texts)) > 2  # the copies of a prompt draw different completions
        recomputed = policy.logprobs(got, temperature=sampling.temperature).detach()
        torch.testing.assert_close(got.logprobs[mask], recomputed[mask], rtol=0, atol=1e-4)
        assert (got.completion_ids[~mask] == policy.pad_token_id).all()


@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_two_views_per_world_decode_alike_in_lean_and_hf(arch, tiny_policy, grounding_obs):
    policy = tiny_policy(arch, seed=0)
    first, second = grounding_obs(arch, [0, 1]), grounding_obs(arch, [5, 6])
    obs = Observation(image=torch.stack([first.image, second.image], dim=1), instruction=first.instruction)
    greedy = Sampling(max_new_tokens=8, temperature=0.0)
    want, got = generate(policy, "hf", obs, 1, greedy), generate(policy, "lean", obs, 1, greedy)
    torch.testing.assert_close(got.completion_ids, want.completion_ids, rtol=0, atol=0)
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=0, atol=1e-5)
    for backend in ("lean", "hf"):  # groups: each prompt's cache (hf: its inputs) repeated with both images
        sampled = generate(policy, backend, obs.select([0, 0, 1, 1]), 2, SAMPLING, seed=2)
        assert sampled.images_per_row == 2 and sampled.image_grid_thw.shape[0] == 8
        mask = sampled.completion_mask
        recomputed = policy.logprobs(sampled, temperature=SAMPLING.temperature).detach()
        torch.testing.assert_close(sampled.logprobs[mask], recomputed[mask], rtol=0, atol=1e-4)
    requests = vllm_requests(policy, obs, policy.encode(obs))  # vLLM takes a world's views as a list, in order
    assert [len(r["multi_modal_data"]["image"]) for r in requests] == [2, 2]
    assert all(r["prompt_token_ids"].count(policy.processor.image_token_id) == 2 for r in requests)


def test_lean_loop_stops_at_eos_and_keeps_min_new_tokens(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    obs = grounding_obs("qwen2_vl", [0, 0, 1, 1])
    eos = policy.eos_token_ids[0]
    # A model that strongly prefers EOS: raise the EOS row of the output head.
    with torch.no_grad():
        policy.model.lm_head.weight[eos] += 5 * policy.model.lm_head.weight.abs().max()
    policy.model.model.language_model.norm.weight.data.abs_()
    short = generate(policy, "lean", obs, 2, Sampling(max_new_tokens=12, temperature=1.0))
    assert short.completion_mask.sum(-1).min() < 12  # some rows ended early, on EOS
    for row, ids in zip(short.completion_mask, short.completion_ids, strict=True):
        n = int(row.sum())
        assert n == 12 or ids[n - 1] == eos  # a completion ends on its EOS, or runs to the limit
    policy.model.generation_config.min_new_tokens = 12
    held = generate(policy, "lean", obs, 2, Sampling(max_new_tokens=12, temperature=1.0))
    assert held.completion_mask.all() and not (held.completion_ids[:, :-1] == eos).any()


def test_lean_loop_restricts_a_vla_to_action_tokens(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen3_vl", seed=0, prompt_template="{image} {instruction}")
    codec = add_action_tokens(policy, torch.full((3,), -1.0), torch.ones(3), bins=16, chunk=2)
    obs = grounding_obs("qwen3_vl", [0, 0, 1, 1])
    got = generate(policy, "lean", obs, 2, Sampling(temperature=1.0))
    assert got.completion_ids.shape == (4, 6) and got.completion_mask.all()
    assert torch.isin(got.completion_ids, codec.token_ids).all()
    torch.testing.assert_close(got.logprobs, policy.logprobs(got).detach(), rtol=0, atol=1e-4)
    greedy = Sampling(temperature=0.0)
    torch.testing.assert_close(
        generate(policy, "lean", obs, 2, greedy).completion_ids, generate(policy, "hf", obs, 2, greedy).completion_ids
    )


def test_greedy_groups_decode_each_prompt_once(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_vl", seed=0)
    greedy = Sampling(max_new_tokens=6, temperature=0.0)
    grouped = generate(policy, "hf", grounding_obs("qwen2_vl", [3, 3, 4, 4]), 2, greedy)
    single = generate(policy, "hf", grounding_obs("qwen2_vl", [3, 4]), 1, greedy)
    torch.testing.assert_close(grouped.completion_ids, single.completion_ids.repeat_interleave(2, 0), rtol=0, atol=0)
    torch.testing.assert_close(grouped.logprobs, single.logprobs.repeat_interleave(2, 0), rtol=0, atol=0)


def test_vla_stays_restricted_to_action_tokens_under_the_static_backend(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen3_vl", seed=0, prompt_template="{image} {instruction}")
    codec = add_action_tokens(policy, torch.full((3,), -1.0), torch.ones(3), bins=16, chunk=2)
    obs = grounding_obs("qwen3_vl", [0, 0, 1, 1])
    want = generate(policy, "hf", obs, 2, Sampling(temperature=1.0))
    got = generate(policy, "static", obs, 2, Sampling(temperature=1.0))
    assert got.completion_ids.shape == (4, 6) and got.completion_mask.all()  # C*D = 2*3 tokens, no EOS
    assert torch.isin(got.completion_ids, codec.token_ids).all()
    torch.testing.assert_close(got.completion_ids, want.completion_ids, rtol=0, atol=0)
    torch.testing.assert_close(got.logprobs, want.logprobs, rtol=0, atol=1e-5)
    # Log-probs of the distribution restricted to the 16 action tokens, as the training pass computes them.
    torch.testing.assert_close(got.logprobs, policy.logprobs(got).detach(), rtol=0, atol=1e-4)
    assert (got.logprobs > torch.log(torch.tensor(1e-3))).all()  # over the full vocabulary some would be tiny


def test_backend_choice_errors_name_the_choices(tiny_policy):
    policy = tiny_policy("qwen2_vl", seed=0)
    with pytest.raises(ValueError, match="lean, hf, static, vllm"):
        policy.generation_backend = "sglang"
    with pytest.raises(ValueError, match="takes no options"):
        policy.set_generation_backend("static", gpu_memory_utilization=0.5)
    assert policy.generation_backend == "lean"  # a refused choice leaves the backend as it was


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed: the missing-vLLM error cannot be shown")
def test_vllm_backend_without_vllm_names_the_extra(tiny_policy):
    with pytest.raises(ImportError, match=r"mmrl\[vllm\]"):
        tiny_policy("qwen2_vl", seed=0).generation_backend = "vllm"


# ---------------------------------------------------------------------------------------------- vLLM, pure parts
def test_vllm_requests_hold_the_prompt_ids_and_the_image(tiny_policy, grounding_obs):
    policy = tiny_policy("qwen2_5_vl", seed=0)
    obs = grounding_obs("qwen2_5_vl", [0, 1], ["Find it.", "Find the yellow triangle left of the blue square."])
    inputs = policy.encode(obs)
    requests = vllm_requests(policy, obs, inputs)
    assert len(requests) == 2
    for request, instruction, image in zip(requests, obs.instruction, obs.image):
        # The training prompt's ids, unpadded, each image's placeholders collapsed to the one vLLM expands: the chat
        # text with one placeholder per image, token for token (nothing re-tokenised).
        ids = request["prompt_token_ids"]
        assert ids.count(policy.processor.image_token_id) == 1
        text = policy.processor.prompt_text(instruction, template=policy.prompt_template)
        assert policy.processor.tokenizer.decode(ids, skip_special_tokens=False) == text
        (pil,) = request["multi_modal_data"]["image"]
        assert isinstance(pil, Image.Image) and pil.size == (image.shape[1], image.shape[0])
        assert torch.equal(torch.from_numpy(np.asarray(pil).copy()), image)
    # Expanding the placeholder as vLLM's processor does gives exactly the ids the Rollout carries.
    texts = [policy.processor.tokenizer.decode(r["prompt_token_ids"]) for r in requests]
    ids = policy.processor(texts, [r["multi_modal_data"]["image"] for r in requests])
    torch.testing.assert_close(ids["input_ids"], inputs["input_ids"].cpu(), rtol=0, atol=0)


def test_vllm_sampling_params_match_the_hf_call(tiny_policy):
    policy = tiny_policy("qwen2_vl", seed=0)
    text = sampling_params_kwargs(policy, 4, Sampling(max_new_tokens=12, temperature=0.7, top_p=0.9), seed=5)
    assert text["n"] == 4 and text["temperature"] == 0.7 and text["top_p"] == 0.9 and text["top_k"] == -1
    assert text["max_tokens"] == 12 and text["logprobs"] == 0 and text["seed"] == 5
    assert text["stop_token_ids"] == policy.eos_token_ids and text["repetition_penalty"] == 1.0
    assert set(text["logit_bias"]) == set(policy.suppress_token_ids) and max(text["logit_bias"].values()) <= -100
    greedy = sampling_params_kwargs(policy, 4, Sampling(temperature=0.0))
    assert greedy["n"] == 1 and greedy["temperature"] == 0.0  # one decoding per prompt, repeated G times
    codec = add_action_tokens(policy, torch.full((2,), -1.0), torch.ones(2), bins=8, chunk=3)
    action = sampling_params_kwargs(policy, 2, Sampling(max_new_tokens=50))
    assert action["max_tokens"] == action["min_tokens"] == 6 and action["ignore_eos"]
    assert action["allowed_token_ids"] == codec.token_ids.tolist() and "logit_bias" not in action


def fake_request(completions: list[tuple[list[int], list[float]]], shuffled: bool = False):
    """A stand-in for vLLM's `RequestOutput`, with its documented fields only (see `completions_from_vllm`)."""
    outputs = [
        SimpleNamespace(
            index=i,
            token_ids=ids,
            logprobs=[{t: SimpleNamespace(logprob=lp, rank=1)} for t, lp in zip(ids, lps)],
            finish_reason="stop",
        )
        for i, (ids, lps) in enumerate(completions)
    ]
    return SimpleNamespace(outputs=outputs[::-1] if shuffled else outputs)


def test_vllm_outputs_become_padded_completions():
    """Pure conversion only: the fake outputs mimic vLLM's `RequestOutput` / `CompletionOutput` structure."""
    outputs = [
        fake_request([([5, 6, 2], [-0.1, -0.2, -0.3]), ([7], [-1.0])], shuffled=True),  # read back by `.index`
        fake_request([([8, 9], [-0.5, -0.6]), ([4, 4, 4], [-0.7, -0.8, -0.9])]),
    ]
    out = completions_from_vllm(outputs, pad_token_id=0)
    assert out.completion_ids.tolist() == [[5, 6, 2], [7, 0, 0], [8, 9, 0], [4, 4, 4]]
    assert out.completion_mask.tolist() == [[True] * 3, [True, False, False], [True, True, False], [True] * 3]
    torch.testing.assert_close(
        out.logprobs, torch.tensor([[-0.1, -0.2, -0.3], [-1.0, 0, 0], [-0.5, -0.6, 0], [-0.7, -0.8, -0.9]])
    )
    repeated = completions_from_vllm([fake_request([([3, 2], [-0.4, -0.5])])], pad_token_id=0, repeat=2)
    assert repeated.completion_ids.tolist() == [[3, 2], [3, 2]]
    with pytest.raises(ValueError, match="logprobs=0"):
        completions_from_vllm([SimpleNamespace(outputs=[SimpleNamespace(index=0, token_ids=[1], logprobs=None)])], 0)


def test_the_static_backend_compiles_only_on_cuda_and_in_the_main_thread():
    """Pipelined collection decodes in a thread, where torch's CUDA graph trees fail (pytorch/pytorch#123177, seen
    on an H100): there the static cache runs uncompiled. The policy is a stand-in whose device reads CUDA, since only
    `.device` is read and no GPU exists here."""
    backend = StaticCacheBackend()
    on_gpu, on_cpu = SimpleNamespace(device=torch.device("cuda")), SimpleNamespace(device=torch.device("cpu"))
    assert backend.generate_kwargs(on_gpu, 100, 20) == {
        "cache_implementation": "static", "max_cache_len": 256, "disable_compile": False
    }  # fmt: skip
    assert backend.generate_kwargs(on_cpu, 100, 20)["disable_compile"] is True
    in_thread: dict = {}
    thread = threading.Thread(target=lambda: in_thread.update(backend.generate_kwargs(on_gpu, 300, 20)))
    thread.start()
    thread.join()
    assert in_thread == {"cache_implementation": "static", "max_cache_len": 512, "disable_compile": True}


# ------------------------------------------------------------------------------- compiled static cache, GPU only
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("arch", TINY_ARCHS)
def test_compiled_static_cache_on_cuda_gives_the_hf_tokens(arch, tiny_policy, grounding_obs):  # pragma: no cover
    """On CUDA transformers compiles the static backend's decoding step. In float32 it must still give `hf`'s
    tokens, greedy and sampled, and sampling-time log-probs that the training forward reproduces."""
    policy = tiny_policy(arch, seed=0)
    policy.model.to("cuda")
    obs = grounding_obs(arch, [0, 1], ["Find it.", "Find the yellow triangle left of the blue square."])
    for sampling, group_size in ((Sampling(max_new_tokens=8, temperature=0.0), 1), (SAMPLING, 2)):
        obs_g = obs.select([i for i in range(len(obs)) for _ in range(group_size)])
        want = generate(policy, "hf", obs_g, group_size, sampling)
        got = generate(policy, "static", obs_g, group_size, sampling)
        assert got.completion_ids.tolist() == want.completion_ids.tolist()
        mask = got.completion_mask
        torch.testing.assert_close(got.logprobs[mask], want.logprobs[mask], rtol=0, atol=1e-3)
        recomputed = policy.logprobs(got, temperature=sampling.temperature).detach()
        torch.testing.assert_close(got.logprobs[mask], recomputed[mask], rtol=0, atol=1e-3)


# ---------------------------------------------------------------------------------------------- vllm_process, its GPU route
def test_each_trainer_ranks_engine_process_takes_that_ranks_gpu():
    """vLLM's worker in the engine process takes `cuda:<LOCAL_RANK>`: the child's LOCAL_RANK is its trainer rank's
    GPU (under torchrun rank r trains on cuda:r), not 0 for every rank."""
    from mmrl.policy.engines.vllm_process import engine_local_rank

    assert engine_local_rank(torch.device("cuda:3")) == 3
    assert engine_local_rank(torch.device("cpu")) == 0


def test_a_weight_push_by_another_policy_sends_that_policys_weights(tiny_policy, monkeypatch):
    """The GPU weight transfer reads the policy it was made for: a push by a second policy object (the collector
    thread's copy, then the trainer's policy for an evaluation) must send the second one's weights. The CUDA pieces
    (vLLM's IPC transfer, the child) are replaced by in-process stand-ins that record what they would send."""
    from mmrl.policy.engines import vllm_process
    from mmrl.policy.engines.vllm_prompts import engine_named_weights

    sent = []

    class Transfer:  # what vLLM's IPC trainer engine does with its source: send every weight it yields
        def __init__(self, backend, policy):
            self.policy = policy

        def send_weights(self):
            sent.append(sum(float(t.double().sum()) for _, t in engine_named_weights(self.policy.model)))

    monkeypatch.setattr(vllm_process, "_gpu_transfer", Transfer)
    backend = vllm_process.VLLMProcessBackend()
    monkeypatch.setattr(backend, "_started", lambda policy, what: None)
    monkeypatch.setattr(backend, "_call", lambda *args: None)
    backend._on_gpu = backend._built = True  # as after the engine was built on a GPU
    first, second = tiny_policy("qwen2_vl", seed=0), tiny_policy("qwen2_vl", seed=1)
    weight_sum = lambda policy: sum(float(t.double().sum()) for _, t in engine_named_weights(policy.model))  # noqa: E731
    backend.push(first)
    backend.push(second)
    backend.push(second)
    assert sent == [weight_sum(first), weight_sum(second), weight_sum(second)]
