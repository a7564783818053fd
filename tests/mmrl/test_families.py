"""The same contract for every model family (`mmrl.families`), on tiny real models of each.

Qwen3-VL stands for the Qwen-VL family here (tests/mmrl/test_policy.py, test_backends.py and test_conversations.py
cover Qwen2-VL, Qwen2.5-VL and Qwen3-VL in depth); Qwen3.5, Gemma 3, Idefics3 (SmolVLM), SmolVLM2, PaliGemma,
InternVL, LLaVA-OneVision, GLM-4.1V and Gemma 4 are built from their real transformers classes with a tokenizer
carrying their real special tokens and chat template (PaliGemma has none: its processor writes the prompt)
(assets/tiny_models/, scripts/make_family_assets.py). A family the installed transformers lacks (Gemma 4 is in
5.19 and 5.24, not known for older ones) is skipped, with the error that names it as the reason.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from dataclasses import replace

import pytest
import torch

import sim
from mmrl.families import missing_classes
from mmrl.policy import VLMPolicy, build_tiny
from mmrl.policy.vision import to_pil
from mmrl.policy.vlm.processing import user_content
from mmrl.types import Sampling, Turn
from sim.base import Observation


def family(arch: str, *rest):
    """`(arch, *rest)` as a test's parameters, skipped where the installed transformers lacks the family's classes,
    with the error that names it as the reason."""
    reason = missing_classes(arch)
    return pytest.param(arch, *rest, marks=pytest.mark.skipif(bool(reason), reason=reason))


FAMILIES = (
    "qwen3_vl", "gemma3", "idefics3", "smolvlm", "qwen3_5", "paligemma", "internvl", "llava_onevision", "glm4v",
    "gemma4",
)  # fmt: skip
IMAGE_SIZE = dict.fromkeys(FAMILIES, 64)
TEMPLATE = "{instruction} {image} Answer as <answer>[x1,y1,x2,y2]</answer>."
# Sampled log-probs against the training forward's: the same float32 computation in another order (cached keys and
# values, one token at a time), measured at most 5e-7 on these models.
LOGPROB_ATOL = 1e-5


def observations(arch: str, seeds: list[int], views: int = 1, instructions: list[str] | None = None) -> Observation:
    env = sim.make("grounding", num_envs=len(seeds), image_size=IMAGE_SIZE[arch])
    obs = env.reset(seed=seeds)
    image = obs.image
    if views == 2:  # a second view per world: the next world's image (so the two differ)
        image = torch.stack([image, image.roll(1, dims=0)], dim=1)
    return Observation(image=image, instruction=list(instructions or obs.instruction))


@pytest.fixture(scope="module", params=[family(arch) for arch in FAMILIES])
def policy(request) -> VLMPolicy:
    return build_tiny(request.param, seed=0, prompt_template=TEMPLATE)


def arch_of(policy: VLMPolicy) -> str:
    return policy.model.config.model_type


def test_lean_gives_hf_greedy_tokens_and_sampled_logprobs_equal_the_training_forward(policy):
    arch = arch_of(policy)
    # Prompts of different lengths: left padding and each row's own positions are exercised.
    obs = observations(arch, [0, 1], instructions=["Find the red square.", "Find the blue circle and then stop."])
    greedy = Sampling(max_new_tokens=8, temperature=0)
    try:
        policy.generation_backend = "hf"
        want = policy.generate(obs, sampling=greedy)
        policy.generation_backend = "lean"
        got = policy.generate(obs, sampling=greedy)
        assert torch.equal(got.completion_ids, want.completion_ids)
        torch.manual_seed(3)
        sampled = policy.generate(obs, group_size=2, sampling=Sampling(max_new_tokens=8, temperature=0.8))
    finally:
        policy.generation_backend = "lean"
    assert not torch.equal(sampled.completion_ids[0], sampled.completion_ids[1])  # a real sample, not greedy
    with torch.no_grad():
        rescored = policy.logprobs(sampled, temperature=0.8)
    mask = sampled.completion_mask
    torch.testing.assert_close(rescored[mask], sampled.logprobs[mask], atol=LOGPROB_ATOL, rtol=0)


def test_two_images_per_prompt_are_both_seen(policy):
    arch = arch_of(policy)
    obs = observations(arch, [0, 1], views=2)
    torch.manual_seed(0)
    rollout = policy.generate(obs, group_size=1, sampling=Sampling(max_new_tokens=4, temperature=1.0))
    assert rollout.images_per_row == 2 and len(rollout.image_units) == 4
    features = policy.processor.features(rollout.image_units, rollout.image_inputs)
    held = (rollout.prompt_ids == policy.processor.image_token_id).sum(-1)
    assert held.tolist() == [int(features[0] + features[1]), int(features[2] + features[3])]
    with torch.no_grad():
        before = policy.logprobs(rollout)
        # The second image of row 0 blacked out: row 0's log-probs move, row 1's stay (its images are its own).
        units = rollout.image_units.tolist()
        start, stop = units[0], units[0] + units[1]
        pixels = rollout.pixel_values.clone()
        pixels[start:stop] = pixels.min()
        after = policy.logprobs(replace(rollout, pixel_values=pixels))
    mask = rollout.completion_mask
    assert not torch.allclose(before[0][mask[0]], after[0][mask[0]])
    torch.testing.assert_close(before[1][mask[1]], after[1][mask[1]], atol=1e-6, rtol=0)


def test_a_two_turn_conversation_is_the_template_turn_for_turn_with_the_sampled_tokens(policy):
    arch = arch_of(policy)
    first, second = observations(arch, [0]), observations(arch, [1])
    tok = policy.processor.tokenizer
    processor = policy.processor
    answer_text = "<answer>[1,2,3,4]</answer>"
    # The answer ends as the model ends a turn: with the family's turn-closing token (GLM-4.1V has none: it stops by
    # opening the next user turn, `<|user|>`, one of its EOS tokens).
    closing = tok.convert_tokens_to_ids(processor.family.turn_end)
    assert closing in policy.eos_token_ids
    answer_ids = tok(answer_text, add_special_tokens=False)["input_ids"] + [closing]
    history = [[Turn(views=first.views[0], instruction=first.instruction[0], answer_ids=answer_ids)]]
    if processor.family.prompt is not None:  # PaliGemma: no chat template, one prefix and one answer
        with pytest.raises(ValueError, match=rf"a {arch} model has no chat template .* set model.history_turns to 0"):
            policy.encode_conversations(second, history)
        return
    inputs, _ = policy.encode_conversations(second, history)
    ids = inputs["input_ids"][0].tolist()

    # What the model saw when it sampled the answer: the first turn's own prompt, then the answer's tokens verbatim.
    # (Its image is written as in a prompt of two images: LLaVA-OneVision tiles a lone image, not one of several.)
    images = [to_pil(first.views[0, 0]), to_pil(second.views[0, 0])]
    image_texts = processor.vision(images, [2]).texts
    alone_text = processor.expand(processor.prompt_text(first.instruction[0], 1, TEMPLATE), iter(image_texts[:1]))
    alone = tok(alone_text, add_special_tokens=False)["input_ids"]
    if arch != "llava_onevision":
        assert alone == policy.encode(first)["input_ids"][0].tolist()
    assert ids[: len(alone)] == alone
    assert ids[len(alone) : len(alone) + len(answer_ids)] == answer_ids

    # The rest is the chat template's rendering of what follows the answer, its turn closed exactly once.
    messages = [
        {"role": "user", "content": user_content(first.instruction[0], 1, TEMPLATE)},
        processor.assistant_message(answer_text),
        {"role": "user", "content": user_content(second.instruction[0], 1, TEMPLATE)},
    ]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    tail = rendered.split(answer_text, 1)[1]
    want_tail = tok(processor.expand(tail, iter(image_texts[1:])), add_special_tokens=False)["input_ids"]
    assert want_tail[0] == answer_ids[-1]  # the template closes the turn with the token the answer ended with
    assert ids[len(alone) + len(answer_ids) :] == want_tail[1:]
    turn_end = tok.convert_tokens_to_ids(processor.family.turn_end)
    assert ids.count(turn_end) == tok(rendered, add_special_tokens=False)["input_ids"].count(turn_end)


def test_a_prompt_whose_image_tokens_do_not_match_its_images_is_refused_before_the_forward(policy):
    arch = arch_of(policy)
    rollout = policy.generate(observations(arch, [0, 1]), sampling=Sampling(max_new_tokens=2, temperature=0))
    ids = rollout.prompt_ids.clone()
    first = int((ids[1] == policy.processor.image_token_id).nonzero()[0])
    ids[1, first] = policy.pad_token_id  # row 1 loses one image token
    calls = []
    hook = policy.model.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        features = int(policy.processor.features(rollout.image_units, rollout.image_inputs)[1])
        with pytest.raises(ValueError, match=rf"row 1 holds {features - 1} image tokens .*\(image 1: {features}\)"):
            policy.logprobs(replace(rollout, prompt_ids=ids))
    finally:
        hook.remove()
    assert not calls


@pytest.mark.parametrize(
    ("arch", "views"),
    [
        ("gemma3", 2),
        ("idefics3", 2),
        ("paligemma", 2),
        ("internvl", 2),
        ("llava_onevision", 1),
        ("llava_onevision", 2),
        family("gemma4", 2),
    ],
)
def test_prompts_equal_the_families_own_transformers_processor(arch, views, monkeypatch):
    import copy

    import transformers
    from transformers.processing_utils import ProcessorMixin

    # InternVL's, LLaVA-OneVision's, GLM-4.1V's and Gemma 4's processors check for their video processors, which need
    # torchvision (absent on CPU installs); images alone do not use them.
    monkeypatch.setattr(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, value: None)
    policy = build_tiny(arch, prompt_template=TEMPLATE)
    obs = observations(arch, [0, 1], views=views)
    if views == 1:  # a lone image of another shape than the tiles: LLaVA-OneVision's anyres grid and unpadding
        obs = Observation(image=obs.image[:, :, :40], instruction=obs.instruction)
    ours = policy.encode(obs)
    settings = {k: v for k, v in policy.processor.settings.items() if k != "merge_size"}
    # Their processors may add tokens to the tokenizer (PaliGemma's <loc>/<seg>, already there): a copy keeps ours.
    parts = (policy.processor.image_processor, copy.deepcopy(policy.processor.tokenizer))
    theirs_processor = {
        "gemma3": lambda: transformers.Gemma3Processor(*parts, **settings),
        "idefics3": lambda: transformers.Idefics3Processor(*parts, **settings),
        "paligemma": lambda: transformers.PaliGemmaProcessor(*parts),
        "internvl": lambda: transformers.InternVLProcessor(*parts, **settings),
        "llava_onevision": lambda: transformers.LlavaOnevisionProcessor(*parts, **settings),
        "glm4v": lambda: transformers.Glm4vProcessor(*parts),
        # Gemma 4's also takes an audio feature extractor and a video processor (torchvision): images use neither.
        "gemma4": lambda: transformers.Gemma4Processor(None, *parts, None),
    }[arch]()
    texts = [policy.processor.prompt_text(s, views, TEMPLATE) for s in obs.instruction]
    if arch == "paligemma":  # its processor writes <bos> after the images and the closing newline itself
        bos = policy.processor.tokenizer.bos_token
        assert all(t.startswith("<image>" * views + bos) and t.endswith("\n") for t in texts)
        texts = [t.replace(bos, "", 1)[:-1] for t in texts]
    images = [[to_pil(image) for image in row] for row in obs.views]
    theirs = theirs_processor(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)
    assert torch.equal(ours["input_ids"], theirs["input_ids"])
    for key, value in policy.processor.model_inputs(ours.vision.pixel_values, ours.vision.per_image, {}).items():
        if key != "pixel_values":  # LLaVA-OneVision's image_sizes and batch_num_images
            assert torch.equal(value, torch.as_tensor(theirs[key]).reshape(value.shape)), key
    real = theirs["pixel_values"].flatten(0, 1) if theirs["pixel_values"].dim() == 5 else theirs["pixel_values"]
    if theirs["pixel_values"].dim() == 5:  # Idefics3 pads each row's tiles with zero images
        real = real[real.flatten(1).abs().sum(-1) > 0]
    torch.testing.assert_close(ours.vision.pixel_values, real)


def test_smolvlm2_images_are_written_as_its_processor_writes_them():
    # SmolVLMProcessor itself needs num2words (for videos); its image strings come from this function.
    from transformers.models.smolvlm.processing_smolvlm import get_image_prompt_string

    policy = build_tiny("smolvlm", prompt_template=TEMPLATE)
    images = [to_pil(torch.zeros(h, w, 3, dtype=torch.uint8)) for h, w in ((48, 40), (30, 60), (20, 20))]
    vision = policy.processor.vision(images)
    out = policy.processor.image_processor(images=[[i] for i in images], return_row_col_info=True)
    want = [
        get_image_prompt_string(r[0], c[0], 4, "<fake_token_around_image>", "<image>", "<global-img>")
        for r, c in zip(out["rows"], out["cols"], strict=True)
    ]
    assert vision.texts == want and vision.units.tolist() == [5, 3, 5]


@pytest.mark.parametrize("arch", [family(arch) for arch in FAMILIES if arch != "qwen3_vl"])
def test_a_folder_laid_out_as_the_hubs_loads_with_identical_logprobs(arch, tmp_path):
    policy = build_tiny(arch, prompt_template=TEMPLATE)
    rollout = policy.generate(observations(arch, [0]), sampling=Sampling(max_new_tokens=4, temperature=0))
    policy.save_pretrained(tmp_path)
    for name in ("config.json", "preprocessor_config.json", "tokenizer.json"):
        assert (tmp_path / name).is_file()
    # PaliGemma has no chat template; Qwen3.5, PaliGemma, GLM-4.1V, Gemma 4 no processor numbers beyond the image
    # processor's.
    assert (tmp_path / "chat_template.jinja").is_file() == (arch != "paligemma")
    assert (tmp_path / "processor_config.json").is_file() == (arch not in ("qwen3_5", "paligemma", "glm4v", "gemma4"))
    from mmrl.policy import load_policy
    from mmrl.runtime.config import ModelConfig

    loaded = load_policy(ModelConfig(path=str(tmp_path), prompt_template=TEMPLATE))  # as `model.path=<folder>`
    assert isinstance(loaded, VLMPolicy) and loaded.family.name == arch
    with torch.no_grad():
        torch.testing.assert_close(loaded.logprobs(rollout), policy.logprobs(rollout), atol=0, rtol=0)
    if arch == "paligemma":
        return
    # A checkpoint that keeps its template only with the processor (chat_template.json) gives the same prompts.
    template = (tmp_path / "chat_template.jinja").read_text()
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    again = VLMPolicy.from_pretrained(tmp_path, prompt_template=TEMPLATE)
    assert torch.equal(again.encode(observations(arch, [0]))["input_ids"], rollout.prompt_ids)


def test_paligemma_reads_its_prefix_bidirectionally_with_positions_from_one():
    policy = build_tiny("paligemma", prompt_template=TEMPLATE)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # left padded
    assert policy.positions(mask).tolist() == [[1, 1, 2], [1, 2, 3]]  # pads at 1, real tokens from 1
    types = policy.family.token_types(torch.zeros(1, 5, dtype=torch.long), policy.processor.image_token_id, 3)
    assert types.tolist() == [[0, 0, 0, 1, 1]]  # prefix (images and text) 0, the answer 1
    rollout = policy.generate(observations("paligemma", [0]), sampling=Sampling(max_new_tokens=6, temperature=0))
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    prompt = rollout.prompt_ids.shape[1]

    def scored(**kwargs):  # the model's own forward (positions 1..T), as PaliGemmaProcessor's inputs feed it
        logits = policy.model(input_ids=ids, pixel_values=rollout.pixel_values, **kwargs).logits[0, prompt - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1)
        return logp.gather(-1, rollout.completion_ids[0].unsqueeze(-1)).squeeze(-1)

    with torch.no_grad():
        ours = policy.logprobs(rollout)[0]
        prefix_lm = scored(token_type_ids=(torch.arange(ids.shape[1]) >= prompt).int().unsqueeze(0))
        causal = scored()
    torch.testing.assert_close(ours, prefix_lm, atol=LOGPROB_ATOL, rtol=0)
    # A causal prefix reads the prompt otherwise: far outside the tolerance (a random tiny model's log-probs are
    # near uniform, so the gap is small in absolute terms: 3e-4 here).
    assert (ours - causal).abs().max() > 10 * LOGPROB_ATOL


def train_demo(arch: str, steps: int, tiny_run_config, out, letters_env) -> list[dict]:
    """`steps` GRPO steps of the grounding demo (plus a dense letter-share reward, so an untrained model's samples
    differ in reward) from a random tiny model of `arch`; checks finite losses and moved parameters."""
    from mmrl.trainer import train

    cfg = tiny_run_config(
        out, f"model.path=tiny:{arch}", f"env.name={letters_env}", "env.options.image_size=64",
        f"trainer.total_steps={steps}", "trainer.eval_every=0", "trainer.save_every=0",
    )  # fmt: skip
    policy = build_tiny(arch, seed=0, prompt_template="{instruction}")
    before = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(cfg, policy=policy)
    steps_logged = [m for m in metrics if "loss/policy" in m]
    assert len(steps_logged) == steps and all(math.isfinite(m["loss/policy"]) for m in steps_logged)
    assert all(math.isfinite(m["reward/total"]) for m in steps_logged)
    assert any(not torch.equal(p, before[n]) for n, p in policy.model.named_parameters())
    return steps_logged


@pytest.mark.parametrize("arch", [family(arch) for arch in FAMILIES])
def test_the_demo_task_trains_twenty_grpo_steps(arch, tiny_run_config, tmp_path, letters_env):
    train_demo(arch, 20, tiny_run_config, tmp_path, letters_env)  # 2 prompts x 2 samples x 6 tokens a step: 2-5 s


def test_a_family_this_transformers_lacks_is_named_before_anything_loads(tmp_path, monkeypatch):
    from transformers.models.auto import configuration_auto

    (tmp_path / "config.json").write_text('{"model_type": "qwen3_5"}')
    monkeypatch.delitem(configuration_auto.CONFIG_MAPPING_NAMES, "qwen3_5")  # as in a transformers before Qwen3.5
    with pytest.raises(ValueError, match=r"model family 'qwen3_5' needs a transformers that has its classes"):
        VLMPolicy.from_pretrained(tmp_path)
    # Gemma 4 (in transformers 5.19 and 5.24): its tiny model too is refused by name.
    monkeypatch.delitem(configuration_auto.CONFIG_MAPPING_NAMES, "gemma4", raising=False)
    with pytest.raises(ValueError, match=r"model family 'gemma4' needs a transformers that has its classes"):
        build_tiny("gemma4")
    (tmp_path / "config.json").write_text('{"model_type": "llava"}')
    with pytest.raises(ValueError, match=r"model family 'llava' .* not supported yet; supported: qwen2_vl, "):
        VLMPolicy.from_pretrained(tmp_path)
    # LFM2-VL: transformers' only image processor for it needs torchvision, which the CPU install lacks.
    (tmp_path / "config.json").write_text('{"model_type": "lfm2_vl"}')
    with pytest.raises(ValueError, match=r"'lfm2_vl' .* cannot be used here: .*needs torchvision"):
        VLMPolicy.from_pretrained(tmp_path)


@pytest.mark.parametrize("arch", [family(arch) for arch in FAMILIES])
def test_papo_masks_pixels_of_every_family_and_patches_only_where_rows_are_patches(arch):
    policy = build_tiny(arch, prompt_template=TEMPLATE)
    rollout = policy.generate(observations(arch, [0]), sampling=Sampling(max_new_tokens=2, temperature=0))
    masked = policy.masked(rollout, "pixels", 0.5, torch.Generator().manual_seed(0))
    hidden = masked.pixel_values != rollout.pixel_values
    assert masked.pixel_values.shape == rollout.pixel_values.shape and 0.4 < hidden.float().mean() < 0.6
    with torch.no_grad():
        assert not torch.allclose(policy.logprobs(masked), policy.logprobs(rollout))
    if not policy.family.patch_rows:
        with pytest.raises(ValueError, match="patches needs pixel rows that are vision patches"):
            policy.masked(rollout, "patches", 0.5, torch.Generator().manual_seed(0))
        return
    patched = policy.masked(rollout, "patches", 0.5, torch.Generator().manual_seed(0))
    rows = (patched.pixel_values != rollout.pixel_values).any(-1)  # [U] the patches hidden, each whole
    assert 0.3 < rows.float().mean() < 0.7
    with torch.no_grad():
        assert not torch.allclose(policy.logprobs(patched), policy.logprobs(rollout))


@pytest.mark.parametrize(
    "arch", ["gemma3", "idefics3", "qwen3_5", "paligemma", "internvl", "llava_onevision", "glm4v", family("gemma4")]
)
def test_a_judge_of_any_family_scores_a_padded_batch_as_each_prompt_alone(arch):
    from mmrl.methods.judge import Judge
    from mmrl.runtime.config import JudgeConfig

    judge = Judge(JudgeConfig(batch_size=3), policy=build_tiny(arch, seed=1))
    pictures = torch.randint(0, 256, (3, 48, 48, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    instructions, answers = ["Find the red circle.", "Find the square.", "Draw it."], ["[1, 2]", "no", "<svg/> " * 4]
    got = judge.score(pictures, instructions, answers)  # one left-padded batch of prompts of three lengths
    digits = [judge.policy.processor.tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    want = []
    with torch.no_grad():
        for i in range(3):
            inputs = judge.policy.processor([judge.prompt(instructions[i], answers[i])], [to_pil(pictures[i])])
            logits = judge.policy.model(**judge.policy._with_token_types(dict(inputs))).logits[0, -1].float()
            probs = torch.softmax(logits, -1)[digits]
            want.append(float((probs * torch.arange(10.0)).sum() / probs.sum() / 9))
    torch.testing.assert_close(got.scores, torch.tensor(want), atol=2e-5, rtol=0)


@pytest.mark.parametrize(
    "arch", ["gemma3", "idefics3", "qwen3_5", "paligemma", "internvl", "llava_onevision", "glm4v", family("gemma4")]
)
def test_progress_embeddings_come_from_every_familys_vision_tower(arch):
    from mmrl.methods.progress import trajectory_embeddings
    from mmrl.stages.rollout import collect_episodes

    policy = build_tiny(arch, prompt_template="{instruction} {image}")
    env = sim.make("gui_task", num_envs=4, image_size=96)
    try:  # greedy: the two worlds of a group replay the same episode
        played = collect_episodes(policy, env, [0, 0, 1, 1], 2, Sampling(max_new_tokens=3, temperature=0.0))
    finally:
        env.close()
    embeddings = trajectory_embeddings(policy, played)
    assert torch.isfinite(embeddings).all()
    assert torch.allclose(embeddings[0], embeddings[1]) and not torch.allclose(embeddings[0], embeddings[2])


@pytest.mark.parametrize("arch", ["qwen2_5_vl", "qwen3_vl", "idefics3"])  # pixels, 0-1000, 0-1
def test_grounding_reads_answers_in_the_familys_coordinates(arch):
    from mmrl.families import family_for
    from rewards.coordinates import boxes_to_pixels

    coordinates = family_for(arch).coordinates
    assert coordinates == {"qwen2_5_vl": "pixels", "qwen3_vl": "0-1000", "idefics3": "0-1"}[arch]
    # By hand: a 100 x 50 px box at (10, 20) in a 200 px image is [50, 100, 550, 350] in 0-1000, [0.05, ...] in 0-1.
    written = {"pixels": [10, 20, 110, 70], "0-1000": [50, 100, 550, 350], "0-1": [0.05, 0.1, 0.55, 0.35]}
    pixels = boxes_to_pixels(torch.tensor([written[coordinates]], dtype=torch.float32), coordinates, 200, 200)
    torch.testing.assert_close(pixels, torch.tensor([[10.0, 20.0, 110.0, 70.0]]))

    env = sim.make("grounding", num_envs=2, image_size=128, coordinates=coordinates)
    env.reset(seed=[0, 1])
    target = env.target_boxes  # [2, 4] pixels
    full = {"pixels": 128.0, "0-1000": 1000.0, "0-1": 1.0}[coordinates]
    as_written = (target * full / 128).tolist()
    answers = [f"<answer>[{', '.join(f'{v:.6f}' for v in box)}]</answer>" for box in as_written]
    result = env.step(answers)
    torch.testing.assert_close(result.info["reward_components"]["iou"], torch.ones(2), atol=1e-4, rtol=0)
    if coordinates != "pixels":  # the same answer read as pixels misses
        env_pixels = sim.make("grounding", num_envs=2, image_size=128)
        env_pixels.reset(seed=[0, 1])
        assert (env_pixels.step(answers).info["reward_components"]["iou"] < 0.5).all()


def test_rollout_rows_keep_each_images_units_and_inputs_whatever_the_layout():
    from mmrl.types import Rollout, cat_rollouts

    # 3 rows holding 1, 2 and 1 images; the images have 2, 1, 3 and 1 units (tiles): 7 units in all.
    rollout = Rollout(
        prompt_ids=torch.arange(3).unsqueeze(1),
        prompt_mask=torch.ones(3, 1, dtype=torch.bool),
        pixel_values=torch.arange(7.0).view(7, 1, 1),  # unit u holds the value u
        image_units=torch.tensor([2, 1, 3, 1]),
        completion_ids=torch.zeros(3, 1, dtype=torch.long),
        completion_mask=torch.ones(3, 1, dtype=torch.bool),
        logprobs=torch.zeros(3, 1),
        texts=["a", "b", "c"],
        group_size=1,
        images_per_row=torch.tensor([1, 2, 1]),
        image_inputs={"image_sizes": torch.tensor([[10, 10], [11, 11], [12, 12], [13, 13]])},
        unit_inputs={"pixel_attention_mask": torch.arange(7) * 10},
    )
    picked = rollout.select(torch.tensor([2, 0]))  # row 2 (image 3: unit 6), then row 0 (image 0: units 0, 1)
    assert picked.pixel_values.flatten().tolist() == [6.0, 0.0, 1.0]
    assert picked.image_units.tolist() == [1, 2] and picked.images_per_row.tolist() == [1, 1]
    assert picked.image_inputs["image_sizes"].tolist() == [[13, 13], [10, 10]]
    assert picked.unit_inputs["pixel_attention_mask"].tolist() == [60, 0, 10]
    middle = rollout.rows(1, 3)  # images 1-3: units 2..6
    assert middle.pixel_values.flatten().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]
    assert middle.unit_inputs["pixel_attention_mask"].tolist() == [20, 30, 40, 50, 60]
    assert middle.image_inputs["image_sizes"][:, 0].tolist() == [11, 12, 13] and middle.texts == ["b", "c"]
    joined = cat_rollouts([rollout.rows(0, 1), middle])
    for name in ("pixel_values", "image_units"):
        assert torch.equal(getattr(joined, name), getattr(rollout, name))
    assert torch.equal(joined.unit_inputs["pixel_attention_mask"], rollout.unit_inputs["pixel_attention_mask"])
    assert torch.equal(joined.image_inputs["image_sizes"], rollout.image_inputs["image_sizes"])
