"""The vllm backend for the families other than Qwen-VL, on vLLM's CPU build: what it samples is what the training
forward scores, before and after an update, or it refuses the family before an engine starts, saying why.

One tiny engine per family (module-scoped), built from the real transformers class in assets/tiny_models/, with
one and (where vLLM takes several) two images a prompt. Each call of the backend checks that the ids vLLM ran on are
the training prompt's (`Rollout.prompt_ids`, each image expanded by vLLM's own processor for the family from the
folded prompt, `mmrl.policy.engines.vllm_prompts`); the tests check the sampled log-probs against `VLMPolicy.logprobs` with
the vision placeholders banned, as tests/vllm/test_vllm_backend.py does for Qwen (see there for that reference).

Per family:

* Idefics3 (SmolVLM v1), SmolVLM2, InternVL, GLM-4.1V: float32, tolerance 1e-4 (the Qwen tests'; seen ~1e-6).
* LLaVA-OneVision: one image a prompt (vLLM tiles every image of a prompt as a lone one; transformers shows each of
  several as one base view, so two-image prompts are refused, `VLLMFacts.max_images`).
* Qwen3.5: vLLM's CPU Gated DeltaNet kernel runs bfloat16 only and refuses the tiny asset's head size 16, so the
  engine test builds the tiny model with head size 64 (a size the kernel takes; the released models use 128) in
  bfloat16. Tolerance 2e-2: bfloat16 keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3 per operation), and the
  two sides round in different orders (vLLM's fused kernels against transformers' eager ops); seen up to ~3e-3. The
  test checks that stale weights are farther off than that.
* Gemma 4 is refused everywhere (`VLLMFacts.refused`): no vLLM run here has checked it against the training forward.
* Gemma 3 and PaliGemma are refused on CPU: vLLM's CPU attention has no bidirectional (`mm_prefix`) attention, and
  both attend (images; PaliGemma its whole prefix) bidirectionally. Their engine tests lift that refusal and score
  against the training forward with causal attention (`token_type_ids` marking nothing bidirectional), which checks
  all the rest (the folded prompt with Gemma's merged newlines, PaliGemma's inserted images and `<bos>`, the synced
  weights, the images); they also check that the bidirectional forward is farther off, i.e. that the refusal is
  needed. The tiny assets' byte-level tokenizers write a newline as `Ċ`, where Gemma's vocabulary (which vLLM's
  Gemma 3 and PaliGemma processors look up) holds `\\n`, `\\n\\n`, ... as tokens: the tests add those (as the
  released tokenizers have them), and a tokenizer without them is refused (tested below).

Engines for Gemma 3, Idefics3 (SmolVLM) and Qwen3.5 run by default; the other families' are `slow`.
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import fields, replace

import pytest
import torch
from tokenizers import AddedToken
from transformers import AutoConfig, AutoModelForImageTextToText

import sim
from mmrl.families import Family, missing_classes
from mmrl.policy import VLMPolicy, build_tiny
from mmrl.policy.engines.vllm_prompts import fold_images, unsupported_reason, vllm_requests
from mmrl.policy.vlm.tiny import ASSETS, FAMILY_ARCHS, tiny_processor
from mmrl.types import Sampling
from sim.base import Observation

TEMPLATE = "{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>."
IMAGE_SIZE = 64
SAMPLING = Sampling(max_new_tokens=8, temperature=0.9)
GROUP = 2
ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
TWO_IMAGES = {"gemma3", "idefics3", "smolvlm", "qwen3_5", "internvl", "glm4v"}  # the rest take one in vLLM
DEFAULT = ("gemma3", "idefics3", "qwen3_5")
SLOW = ("smolvlm", "internvl", "llava_onevision", "glm4v", "paligemma")
GEMMA_NEWLINES = ["\n" * k for k in range(1, 5)]


class CausalFamily(Family):
    """A family whose `token_type_ids` mark nothing bidirectional: the training forward as vLLM's CPU attention
    computes it (Gemma 3's image tokens 0 = causal text; PaliGemma's whole sequence 1 = causal suffix)."""

    def token_types(self, input_ids: torch.Tensor, image_token_id: int, prompt_length: int | None) -> torch.Tensor:
        return torch.full_like(input_ids, int(self.prefix_lm), dtype=torch.int)


def with_gemma_newlines(policy: VLMPolicy) -> VLMPolicy:
    """The policy with Gemma's newline tokens in its tokenizer (and rows for them in the model), as the released Gemma 3
    and PaliGemma tokenizers hold them: a run of newlines is one token."""
    tokenizer = policy.processor.tokenizer
    tokenizer.add_tokens([AddedToken(text, special=False, normalized=False) for text in GEMMA_NEWLINES])
    policy.model.resize_token_embeddings(len(tokenizer))
    return policy


def qwen3_5_for_the_cpu_kernel() -> VLMPolicy:
    """The tiny Qwen3.5 with Gated DeltaNet heads of 64 (the asset's 16 are refused by vLLM's CPU kernel), bfloat16."""
    config = AutoConfig.from_pretrained(ASSETS / "tiny_models" / "qwen3_5")
    config.text_config.linear_key_head_dim = config.text_config.linear_value_head_dim = 64
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    return VLMPolicy(model.to(torch.bfloat16), tiny_processor("qwen3_5"), prompt_template=TEMPLATE)


def engine_ready(arch: str) -> VLMPolicy:
    """A tiny policy of `arch` that vLLM's CPU build can sample for as the training forward scores (see the module
    docstring), with the vllm backend set."""
    if arch == "qwen3_5":
        policy = qwen3_5_for_the_cpu_kernel()
    else:
        policy = build_tiny(arch, seed=0, prompt_template=TEMPLATE)
    if arch in ("gemma3", "paligemma"):
        with_gemma_newlines(policy)
        family = policy.processor.family
        policy.processor.family = replace(family, vllm=replace(family.vllm, cpu=""))  # the CPU refusal lifted
    if arch == "smolvlm" and importlib.util.find_spec("num2words") is None:
        pytest.skip("vLLM's SmolVLM processor needs num2words, not installed in this environment (refusal tested)")
    policy.set_generation_backend(
        "vllm", max_model_len=1024, enforce_eager=True, max_images_per_prompt=2 if arch in TWO_IMAGES else 1
    )
    return policy


def observations(images: int) -> Observation:
    """Two grounding prompts, each repeated GROUP times, with `images` views per world."""
    env = sim.make("grounding", num_envs=2 * images, image_size=IMAGE_SIZE)
    obs = env.reset(seed=list(range(2 * images)))
    if images == 2:  # world i shows the images of seeds i and i + 2
        obs = Observation(image=torch.stack([obs.image[:2], obs.image[2:]], dim=1), instruction=obs.instruction[:2])
    return obs.select([i for i in range(2) for _ in range(GROUP)])


def scored(policy: VLMPolicy, rollout, causal: bool = False) -> torch.Tensor:
    """`VLMPolicy.logprobs` of `rollout`, vision placeholders banned (the distribution vLLM samples from); with
    `causal`, as vLLM's CPU attention computes it (`CausalFamily`)."""
    ids = torch.tensor(policy.suppress_token_ids)
    family = policy.family
    policy._restrict = lambda logits: logits.index_fill(-1, ids.to(logits.device), float("-inf"))
    if causal:
        policy.family = CausalFamily(**{f.name: getattr(family, f.name) for f in fields(family)})
    try:
        with torch.no_grad():
            return policy.logprobs(rollout, temperature=SAMPLING.temperature).float()
    finally:
        policy.__dict__.pop("_restrict", None)
        policy.family = family


def assert_matches(arch: str, policy: VLMPolicy, rollout) -> float:
    """The rollout's log-probs equal the training forward's (as vLLM's CPU attention computes it for Gemma 3 and
    PaliGemma); returns the largest difference."""
    mask = rollout.completion_mask
    assert mask.any()
    atol = ATOL[policy.model.dtype]
    causal = arch in ("gemma3", "paligemma")
    want = scored(policy, rollout, causal=causal)
    torch.testing.assert_close(rollout.logprobs[mask], want[mask], rtol=0, atol=atol)
    if causal:  # the refusal on CPU is needed: the model's own (bidirectional) forward is outside the tolerance
        gap = (scored(policy, rollout)[mask] - rollout.logprobs[mask]).abs().max().item()
        assert gap > atol, f"{arch}: bidirectional attention moved the log-probs by only {gap:.1e}"
    return (rollout.logprobs[mask] - want[mask]).abs().max().item()


def sample(policy: VLMPolicy, obs: Observation, seed: int = 0):
    torch.manual_seed(seed)
    return policy.generate(obs, group_size=GROUP, sampling=SAMPLING)


@pytest.fixture(scope="module", params=[*DEFAULT, *(pytest.param(arch, marks=pytest.mark.slow) for arch in SLOW)])
def engine_policy(request):
    arch = request.param
    policy = engine_ready(arch)
    yield arch, policy
    policy.backend.close()


@pytest.mark.parametrize("images", [1, 2])
def test_sampled_logprobs_equal_the_training_forward(engine_policy, images):
    arch, policy = engine_policy
    if images == 2 and arch not in TWO_IMAGES:
        pytest.skip(f"vLLM's {arch} takes one image a prompt here (refusal tested)")
    obs = observations(images)
    rollout = sample(policy, obs)
    assert rollout.images_per_row == images
    # The prompt vLLM was sent: the training ids with each image folded back to what vLLM's processor expands.
    requests = vllm_requests(policy, obs, policy.encode(obs))
    assert all(len(r["multi_modal_data"]["image"]) == images for r in requests)
    assert all(len(r["prompt_token_ids"]) < m.sum() for r, m in zip(requests, rollout.prompt_mask))
    print(f"{arch}, {images} image(s): max |vLLM - forward| = {assert_matches(arch, policy, rollout):.2e}")


def test_an_optimiser_step_reaches_the_engine(engine_policy):
    arch, policy = engine_policy
    obs = observations(2 if arch in TWO_IMAGES else 1)  # images seen before: stale encoder-cache entries would hit
    rollout = sample(policy, obs)
    before = copy.deepcopy(policy)  # the weights that sampled `rollout` (the copy has no engine)
    optimizer = torch.optim.AdamW(policy.model.parameters(), lr=1e-2)
    logprobs = policy.logprobs(rollout, temperature=SAMPLING.temperature)
    mask = rollout.completion_mask
    (-(logprobs.float() * mask).sum() / mask.sum()).backward()
    optimizer.step()
    optimizer.zero_grad()

    after = sample(policy, obs, seed=1)
    diff = assert_matches(arch, policy, after)
    stale = scored(before, after, causal=arch in ("gemma3", "paligemma"))
    gap = (stale[after.completion_mask] - after.logprobs[after.completion_mask]).abs().max().item()
    atol = ATOL[policy.model.dtype]
    assert gap > 10 * atol, f"the update moved the log-probs by only {gap:.1e}: the test would not see a missed sync"
    print(f"{arch}: after one AdamW step max |vLLM - forward| = {diff:.2e}, old weights off by {gap:.2e}")


# ---------------------------------------------------------------------------------------------- no engine
def test_gemma_prompts_fold_the_image_out_of_the_merged_newlines():
    """Gemma 3 writes `\\n\\n<start_of_image>` + soft tokens + `<end_of_image>\\n\\n`, and its tokenizer merges
    those newlines with the template's (`user\\n` + `\\n\\n` is one `\\n\\n\\n` token): the folded prompt has the
    template's own newline back and one `<start_of_image>`, which vLLM expands and re-merges."""
    policy = with_gemma_newlines(build_tiny("gemma3", seed=0, prompt_template=TEMPLATE))
    tokenizer = policy.processor.tokenizer
    nl = dict(zip(GEMMA_NEWLINES, tokenizer.convert_tokens_to_ids(GEMMA_NEWLINES)))
    soi, eoi, soft = tokenizer.convert_tokens_to_ids(["<start_of_image>", "<end_of_image>", "<image_soft_token>"])
    text = "\n\n<start_of_image>" + "<image_soft_token>" * 4 + "<end_of_image>\n\n"
    user, answer = 101, 102  # any two plain tokens
    # One image after "user\n", then text: \n\n\n before it, \n\n after it.
    ids = [user, nl["\n\n\n"], soi, *[soft] * 4, eoi, nl["\n\n"], answer]
    assert fold_images(ids, [text], policy.processor.family, tokenizer) == [user, nl["\n"], soi, answer]
    # Two images back to back: the \n\n\n\n between them is both images' margins.
    ids = [user, nl["\n\n"], soi, *[soft] * 4, eoi, nl["\n\n\n\n"], soi, *[soft] * 4, eoi, nl["\n\n"], answer]
    assert fold_images(ids, [text, text], policy.processor.family, tokenizer) == [user, soi, soi, answer]
    # The real prompt: folded, it is the chat template's text with one placeholder per image.
    obs = observations(2)
    for request, instruction in zip(vllm_requests(policy, obs, policy.encode(obs)), obs.instruction):
        want = policy.processor.prompt_text(instruction, num_images=2, template=TEMPLATE)
        assert tokenizer.decode(request["prompt_token_ids"]) == want


@pytest.mark.parametrize(
    "arch",
    [pytest.param(a, marks=pytest.mark.skipif(bool(missing_classes(a)), reason=missing_classes(a)))
     for a in ("qwen2_vl", *FAMILY_ARCHS)],
)  # fmt: skip
def test_folded_prompts_are_the_chat_template_text_with_one_placeholder_per_image(arch):
    """For every family, folding each image back gives the prompt as the chat template wrote it (vLLM's processor
    expands it from there); inputs that lost their images' texts (a plain dict, as the engine process receives them)
    fold the same, the texts computed again from the images."""
    policy = build_tiny(arch, seed=0, prompt_template=TEMPLATE)
    if arch in ("gemma3", "paligemma"):
        with_gemma_newlines(policy)
    images = 1 if arch == "paligemma" else 2
    obs = observations(images)
    inputs = policy.encode(obs)
    requests = vllm_requests(policy, obs, inputs)
    assert requests == vllm_requests(policy, obs, dict(inputs))
    family, tokenizer = policy.processor.family, policy.processor.tokenizer
    for request, instruction in zip(requests, obs.instruction):
        text = policy.processor.prompt_text(instruction, num_images=images, template=TEMPLATE)
        if family.vllm.image == "":  # PaliGemma: vLLM inserts the images and the <bos> after them itself
            text = text.replace(family.template_image, "").replace(family.vllm.after_images, "", 1)
        assert tokenizer.decode(request["prompt_token_ids"]) == text


def test_paligemma_prompts_leave_the_images_and_their_bos_to_vllm():
    """vLLM's PaliGemma processor inserts `<image>` x N + `<bos>` at the prompt's start itself."""
    policy = build_tiny("paligemma", seed=0, prompt_template=TEMPLATE)
    obs = observations(1)
    inputs = policy.encode(obs)
    (request, *_) = vllm_requests(policy, obs, inputs)
    ids = inputs["input_ids"][0][inputs["attention_mask"][0].bool()].tolist()
    tokenizer = policy.processor.tokenizer
    images = ids.count(policy.processor.image_token_id)
    assert images == 16 and ids[images] == tokenizer.bos_token_id
    assert request["prompt_token_ids"] == ids[images + 1 :]


@pytest.mark.parametrize(
    "arch, change, reason",
    [
        ("gemma3", None, r"vLLM's gemma3 processor looks up '\\n', .* in the tokenizer's vocabulary"),
        ("gemma3", "newlines", r"on CPU: vLLM's CPU attention attends every token causally .* Gemma 3 attends"),
        ("paligemma", "newlines", r"on CPU: vLLM's CPU attention .* PaliGemma attends its whole prefix"),
        ("qwen3_5", None, r"vLLM's CPU build runs qwen3_5 in bfloat16 only, and the model is float32"),
        ("qwen3_5", "bfloat16", r"vLLM's CPU kernels for qwen3_5 take linear_key_head_dim in \(64, 128\), .* is 16"),
        ("smolvlm", "no module", r"smolvlm, which needs the Python package 'mmrl_no_such_module'"),
        ("llava_onevision", "two images", r"vLLM's llava_onevision takes at most 1 image\(s\) a prompt"),
        pytest.param(
            "gemma4",
            None,
            r"no run of vLLM here has checked what it samples for Gemma 4",
            marks=pytest.mark.skipif(bool(missing_classes("gemma4")), reason=missing_classes("gemma4")),
        ),
    ],
)
def test_a_family_vllm_cannot_run_here_is_refused_before_an_engine_starts(arch, change, reason):
    policy = build_tiny(arch, seed=0, prompt_template=TEMPLATE)
    family, images = policy.processor.family, 1
    if change == "newlines":
        with_gemma_newlines(policy)
    elif change == "bfloat16":
        policy.model.to(torch.bfloat16)
    elif change == "no module":
        policy.processor.family = family = replace(family, vllm=replace(family.vllm, modules=("mmrl_no_such_module",)))
    elif change == "two images":
        images = 2
    got = unsupported_reason(
        family, policy.processor.tokenizer, policy.model.config, policy.model.dtype, on_cpu=True, images=images
    )
    assert got is not None
    # Through the backend: refused when the engine would be built, naming the backend and the family.
    policy.set_generation_backend("vllm", max_model_len=1024, enforce_eager=True)
    with pytest.raises(ValueError, match=rf"generation_backend='vllm' cannot run a {arch} model here: .*{reason}"):
        sample(policy, observations(images))
    assert policy.backend.llm is None


def test_the_families_vllm_runs_here_are_not_refused():
    for arch in ("idefics3", "internvl", "glm4v"):
        policy = build_tiny(arch, seed=0)
        tokenizer, config = policy.processor.tokenizer, policy.model.config
        assert unsupported_reason(policy.processor.family, tokenizer, config, torch.float32, True, 2) is None
    policy = qwen3_5_for_the_cpu_kernel()
    tokenizer, config = policy.processor.tokenizer, policy.model.config
    assert unsupported_reason(policy.processor.family, tokenizer, config, torch.bfloat16, True, 2) is None
