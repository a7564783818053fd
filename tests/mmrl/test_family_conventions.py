"""The config side of model families: coordinate conventions chosen from the model (and overridden), a system prompt
rendered by each family's chat template, the R1-style think/answer preset, and LoRA on the vision tower."""

from __future__ import annotations

import json

import pytest
import torch

import sim
import sim.gui  # registers gui_click and gui_task
from mmrl.families import FAMILIES, missing_classes
from mmrl.runtime.config import ConfigError, load_config
from mmrl.runtime.paths import REPO


def _env(cfg, num_envs=2):
    return sim.make(cfg.env.name, num_envs=num_envs, **cfg.env.make_options())


def _box(values) -> str:
    return f"<answer>[{', '.join(f'{v:.6f}' for v in values)}]</answer>"


# ---------------------------------------------------------------------------------------------- coordinates
# Per convention, through the config as a user sets it: (overrides, convention, the side the model sees the 128 px
# image at, the instruction's hint). Qwen2.5-VL's tiny processor (14 px patches, merge 2) rounds 128 px to 5 x 28 =
# 140 px (its smart_resize), so its pixel answers are read in a 140 px frame; Qwen3-VL's 16 px patches keep 128.
CONVENTIONS = [
    (["model.path=tiny:qwen3_vl"], "0-1000", 1000.0, " Coordinates are relative, 0 to 1000."),
    (["model.path=tiny:idefics3"], "0-1", 1.0, " Coordinates are relative, 0 to 1."),
    (["model.path=tiny:qwen2_5_vl"], "pixels", 140.0, ""),
    # The override: a Qwen3-VL asked for pixels; the warm start, whose folder says it learned pixels.
    (["model.path=tiny:qwen3_vl", "env.options.coordinates=pixels"], "pixels", 128.0, ""),
    ([], "pixels", 128.0, ""),
]


@pytest.mark.parametrize(("overrides", "convention", "full", "hint"), CONVENTIONS,
                         ids=["qwen3_vl", "idefics3", "qwen2_5_vl", "override", "warm_start"])  # fmt: skip
def test_grounding_reads_answers_in_the_models_convention_from_the_config(overrides, convention, full, hint):
    cfg = load_config(None, ["env.options.image_size=128", *overrides])
    assert cfg.env.options["coordinates"] == convention
    assert cfg.env.options.get("input_size", 0) == (140 if full == 140.0 else 0)
    env = _env(cfg)
    obs = env.reset(seed=[0, 1])
    assert all(text.endswith("." + hint) for text in obs.instruction)
    target = env.target_boxes  # [2, 4] pixels of the drawn 128 px image
    right = env.step([_box(box) for box in (target * full / 128).tolist()])
    torch.testing.assert_close(right.info["reward_components"]["iou"], torch.ones(2), atol=1e-4, rtol=0)
    if full != 128.0:  # the drawn image's pixel numbers, read in the model's units, miss (140 px: fall short)
        env.reset(seed=[0, 1])
        wrong = env.step([_box(box) for box in target.tolist()])
        assert (wrong.info["reward_components"]["iou"] < (0.95 if convention == "pixels" else 0.5)).all()


def test_a_convention_not_known_is_an_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"env\.options\.coordinates must be one of pixels, 0-1000, 0-1"):
        load_config(None, ["env.options.coordinates=0-100"])
    with pytest.raises(ConfigError, match=r"env\.options\.input_size must be an int >= 0"):
        load_config(None, ["env.options.input_size=-1"])
    # Pixels for a family whose processor tiles (Idefics3): the resized side is not known, so the user must say it.
    with pytest.raises(ConfigError, match=r"env\.options\.coordinates is 'pixels' for a idefics3 model.*input_size"):
        load_config(None, ["model.path=tiny:idefics3", "env.options.coordinates=pixels"])
    cfg = load_config(
        None, ["model.path=tiny:idefics3", "env.options.coordinates=pixels", "env.options.input_size=96"]
    )
    assert cfg.env.options["input_size"] == 96
    assert "coordinates" not in load_config(None, ["env.name=maze"]).env.options  # an env without coordinates


def test_a_model_folder_that_says_its_units_wins_over_its_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl", "grounding_coordinates": "0-1"}))
    assert load_config(None, [f"model.path={tmp_path}"]).env.options["coordinates"] == "0-1"
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    assert load_config(None, [f"model.path={tmp_path}"]).env.options["coordinates"] == "0-1000"


def test_gui_click_points_and_boxes_follow_the_convention():
    cfg = load_config(None, ["model.path=tiny:qwen3_vl", "env.name=gui_click"])
    assert cfg.env.options["coordinates"] == "0-1000"
    env = _env(cfg)
    obs = env.reset(seed=[3, 4])
    assert all(text.endswith(" Coordinates are relative, 0 to 1000.") for text in obs.instruction)
    # By hand: the expert clicks each target's centre, written on the 0-1000 grid of the 128 px screen.
    hand = [f"click({round(t.centre[0] * 1000 / 128)}, {round(t.centre[1] * 1000 / 128)})" for t in env.targets]
    assert env.expert_action() == hand
    torch.testing.assert_close(env.step(hand).reward, torch.full((2,), 1.1))
    env.reset(seed=[3, 4])  # the centre in pixels, read on the 0-1000 grid, lands near the top-left corner
    pixels = [f"click({t.centre[0]}, {t.centre[1]})" for t in env.targets]
    assert (env.step(pixels).info["reward_components"]["hit"] == 0).all()

    boxes = load_config(None, ["model.path=tiny:idefics3", "env.name=gui_click", "env.options.answer=box"])
    env = _env(boxes)
    env.reset(seed=[3, 4])
    answers = env.expert_action()
    assert all(0 <= float(v) <= 1 for a in answers for v in a.strip("[]").split(","))
    assert (env.step(answers).info["reward_components"]["hit"] == 1).all()


def test_gui_task_clicks_act_where_the_convention_points():
    cfg = load_config(None, ["model.path=tiny:qwen2_5_vl", "env.name=gui_task", "env.options.tasks=[menu]"])
    assert cfg.env.options["input_size"] == 140  # the 128 px screen as Qwen2.5-VL's processor resizes it
    env = _env(cfg, num_envs=3)
    env.reset(seed=[0, 1, 2])
    for _ in range(2):  # open the menu, pick the item: clicks in the 140 px frame act on the right elements
        result = env.step(env.expert_action())
    assert result.info["success"].all() and result.terminated.all()


# ---------------------------------------------------------------------------------------------- system prompt
SYSTEM = "You are a careful annotator."


# Qwen3-VL's and Gemma 4's own system turn; folded into Gemma 3's first user turn.
@pytest.mark.parametrize(
    "arch",
    ["qwen3_vl", "gemma3",
     pytest.param("gemma4", marks=pytest.mark.skipif(bool(missing_classes("gemma4")), reason=missing_classes("gemma4")))],
)  # fmt: skip
def test_the_system_prompt_reaches_the_prompt_ids_as_the_familys_template_renders_it(arch):
    from mmrl.policy import apply_model_options, load_policy
    from mmrl.policy.vision import to_pil
    from mmrl.types import Sampling

    cfg = load_config(None, [f"model.path=tiny:{arch}", f"model.system_prompt={SYSTEM}", "env.options.image_size=64"])
    assert cfg.model.system_prompt == SYSTEM
    policy = apply_model_options(load_policy(cfg.model), cfg.model)
    env = _env(cfg, num_envs=1)
    obs = env.reset(seed=[0])
    rollout = policy.generate(obs, 1, Sampling(max_new_tokens=1, temperature=0.0))
    # By hand: the family's chat template over a system message and the user turn, images expanded as its processor.
    processor = policy.processor
    messages = [
        {"role": "system", "content": [{"type": "text", "text": SYSTEM}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": obs.instruction[0]}]},
    ]
    text = processor.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert SYSTEM in text and text.index(SYSTEM) < text.index(obs.instruction[0])
    expected, _ = processor.encode([text], [to_pil(obs.image[0])])
    assert rollout.prompt_ids.tolist() == expected["input_ids"].tolist()
    # And without the field, the prompt has no system text.
    policy.processor.system_prompt = ""
    plain = policy.generate(obs, 1, Sampling(max_new_tokens=1, temperature=0.0))
    assert SYSTEM not in processor.tokenizer.decode(plain.prompt_ids[0])


# ---------------------------------------------------------------------------------------------- R1 preset
R1 = REPO / "configs" / "r1_grounding_tiny.yaml"


def test_r1_preset_scores_think_then_answer_and_gives_malformed_answers_a_low_reward_and_a_reason():
    cfg = load_config(R1)
    assert "<think> reasoning process here </think><answer> answer here </answer>" in cfg.model.system_prompt
    env = _env(cfg, num_envs=5)
    env.reset(seed=[7] * 5)
    box = "[" + ", ".join(str(int(v)) for v in env.target_boxes[0].tolist()) + "]"
    texts = [
        f"<think>the red one is left</think> <answer>{box}</answer>",  # R1's format: IoU 1 + 0.5 format
        f"<answer>{box}</answer>",  # no think block: the box counts, the format does not
        f"<think>it is at {box}</think>",  # the box only inside the think block: nothing answered
        f"<think>hm <answer>{box}</answer>",  # never closed: the think block swallows the answer
        box,  # no tags at all
    ]
    result = env.step(texts)
    torch.testing.assert_close(result.reward, torch.tensor([1.5, 1.0, 0.0, 0.0, 0.0]))
    assert result.info["reasons"] == [
        "",
        "no <think>...</think> block before the answer",
        "no <answer>...</answer> after the think block; no box found",
        "the <think> block is never closed; no box found",
        "no <think>...</think> block before the answer; no box found",
    ]


def test_r1_preset_trains_two_steps(tmp_path):
    import contextlib
    import io
    import math

    from mmrl.trainer import train

    shrink = [
        "algo.group_size=2", "trainer.prompts_per_step=2", "trainer.total_steps=2", "trainer.eval_episodes=2",
        "trainer.eval_batch_size=2", "trainer.eval_every=0", "trainer.threads=1", "sampling.max_new_tokens=12",
    ]  # fmt: skip
    cfg = load_config(R1, [*shrink, f"output_dir={tmp_path}"])
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = train(cfg)
    rows = [m for m in metrics if "loss/policy" in m]
    assert len(rows) == 2
    for row in rows:
        assert math.isfinite(row["loss/policy"]) and 0.0 <= row["reward/format"] <= 1.0
        assert math.isclose(row["reward/total"], row["reward/iou"] + 0.5 * row["reward/format"], abs_tol=1e-6)


# ---------------------------------------------------------------------------------------------- LoRA on the vision tower
@pytest.mark.parametrize("arch", ["qwen3_vl", "gemma3"])
def test_lora_on_the_vision_tower_trains_its_adapters_moves_no_base_weight_and_round_trips(arch, tmp_path):
    pytest.importorskip("peft")
    from mmrl.policy import VLMPolicy, apply_model_options, load_policy
    from mmrl.policy.lora import find_vision_modules, plain_model
    from mmrl.types import Sampling

    overrides = [f"model.path=tiny:{arch}", "model.lora.r=4", "env.options.image_size=64"]
    plain_cfg = load_config(None, overrides)
    without = apply_model_options(load_policy(plain_cfg.model), plain_cfg.model)
    towers = tuple(find_vision_modules(without.model))

    def vision_adapters(policy):
        return {
            n: p
            for n, p in policy.model.named_parameters()
            if "lora_" in n and any(f".{t}." in n or n.startswith(f"{t}.") for t in towers)
        }

    assert not vision_adapters(without)  # the default leaves the vision tower out
    cfg = load_config(None, [*overrides, "model.lora.vision=true"])
    policy = apply_model_options(load_policy(cfg.model), cfg.model)
    adapters = vision_adapters(policy)
    assert adapters and all(p.requires_grad for p in adapters.values())
    # Every linear layer of the vision side carries an adapter (the named targets would miss Qwen's `qkv`).
    vision_linears = [
        n
        for n, m in plain_model(policy.model).named_modules()
        if type(m).__name__ == "Linear"
        and any(n.startswith(f"{t}.") for t in towers)
        and ".lora_" not in n
        and not n.endswith(".base_layer")
    ]
    assert vision_linears and all(
        f"{n}.lora_B.default.weight" in {k.removeprefix("base_model.model.") for k in adapters} for n in vision_linears
    ), vision_linears
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    assert not any("lora_" in n for n in base)

    env = _env(cfg, num_envs=2)
    rollout = policy.generate(env.reset(seed=[0, 1]), 1, Sampling(max_new_tokens=3, temperature=0.0))
    logprobs = policy.logprobs(rollout)  # [R, L]
    (logprobs * rollout.completion_mask).sum().backward()
    lora_b = {n: p for n, p in adapters.items() if ".lora_B." in n}
    # lora_B starts at zero, so only it has a gradient at step 0; every vision adapter's is non-zero: the image reaches
    # the loss through it.
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b.values()), [
        n for n, p in lora_b.items() if p.grad is None or not p.grad.abs().sum() > 0
    ]
    trainable = [p for p in policy.model.parameters() if p.requires_grad]
    torch.optim.AdamW(trainable, lr=1e-2).step()
    assert all(p.abs().sum() > 0 for p in lora_b.values())  # the adapters moved
    for name, param in policy.model.named_parameters():  # the frozen base did not
        if name in base:
            assert param.grad is None and torch.equal(param, base[name]), name

    policy.model.eval()
    policy.save_pretrained(tmp_path / "ckpt")
    loaded = VLMPolicy.from_pretrained(tmp_path / "ckpt")
    again = vision_adapters(loaded)
    assert again.keys() == adapters.keys()
    assert all(torch.equal(again[n], adapters[n].detach()) for n in adapters)
    torch.testing.assert_close(loaded.logprobs(rollout), policy.logprobs(rollout).detach(), atol=1e-5, rtol=0)


def test_lora_vision_adds_the_towers_linear_layers_to_named_targets():
    pytest.importorskip("peft")
    from mmrl.policy import apply_model_options, load_policy

    cfg = load_config(None, ["model.path=tiny:qwen3_vl", "model.lora.r=2", "model.lora.target_modules=q_proj",
                             "model.lora.vision=true"])  # fmt: skip
    names = [n for n, _ in apply_model_options(load_policy(cfg.model), cfg.model).model.named_parameters()]
    # Qwen3-VL's vision blocks name their attention `qkv` and `proj`: not q_proj, yet adapted; the language model
    # keeps only its q_proj adapters.
    assert any(".visual.blocks.0.attn.qkv.lora_A." in n for n in names)
    assert any(".visual.merger." in n and ".lora_A." in n for n in names)
    language = {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n in names if ".lora_A." in n and ".visual." not in n}
    assert language == {"q_proj"}
    with pytest.raises(ConfigError, match=r"model\.lora.vision needs model\.lora.r > 0"):
        load_config(None, ["model.lora.vision=true"])


def test_miniwob_clicks_are_brought_to_pixels_before_the_browser_sees_them():
    """No browser here: the click's path from the answer to MiniWoB's CLICK_COORDS, on an env built without one."""
    from types import SimpleNamespace

    from rewards import parse_action
    from sim.gui.miniwob import TASK_HEIGHT, TASK_WIDTH, MiniWoBEnv

    env = object.__new__(MiniWoBEnv)
    env.image_size, env.coordinates, env.input_size = 160, "0-1000", 0
    env.scale = 160 / TASK_HEIGHT
    env.pad = (160 - round(TASK_WIDTH * env.scale)) // 2  # 19 px of black each side of the 122 px wide page
    browser = SimpleNamespace(unwrapped=SimpleNamespace(create_action=lambda kind, coords: (kind, coords)))
    (kind, coords), reason = env._miniwob_action(browser, parse_action("click(500, 500)"))
    # By hand: (500, 500) on the 0-1000 grid is image pixel (80, 80), page point ((80 - 19) * 210 / 160, 80 * 210 / 160).
    assert kind == "CLICK_COORDS" and reason == ""
    torch.testing.assert_close(torch.tensor(coords.tolist()), torch.tensor([61 * 210 / 160, 105.0]))
    env.coordinates = "pixels"
    (_, coords), _ = env._miniwob_action(browser, parse_action("click(80, 80)"))
    torch.testing.assert_close(torch.tensor(coords.tolist()), torch.tensor([61 * 210 / 160, 105.0]))
    assert env._miniwob_action(browser, parse_action("click(5, 500)"))[1] == "the click is outside the page"


def test_a_family_without_a_chat_template_refuses_the_system_prompt():
    from mmrl.policy import apply_model_options, load_policy

    cfg = load_config(None, ["model.path=tiny:paligemma", f"model.system_prompt={SYSTEM}"])
    with pytest.raises(ValueError, match=r"model\.system_prompt: a paligemma model has no chat template"):
        apply_model_options(load_policy(cfg.model), cfg.model)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_folder_of_each_family_gives_the_env_that_familys_units_and_resized_side(name, tmp_path):
    """The config reads the family table itself: a folder whose config.json names the family gets its units; asked for
    pixels, a family whose processor resizes within a pixel budget (Qwen-VL's smart_resize) gets the side it resizes
    to, any other the error that asks for `env.options.input_size`."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": name}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"patch_size": 14, "merge_size": 2}))
    folder = [f"model.path={tmp_path}", "env.options.image_size=128"]
    assert load_config(None, folder).env.options["coordinates"] == FAMILIES[name].coordinates
    pixels = [*folder, "env.options.coordinates=pixels"]
    if FAMILIES[name].pixel_bounds:  # by hand: 128 px onto a 28 px grid (14 px patches, merge 2) is 5 x 28 = 140 px
        assert load_config(None, pixels).env.options["input_size"] == 140
    else:
        with pytest.raises(ConfigError, match=rf"is 'pixels' for a {name} model.*env\.options\.input_size"):
            load_config(None, pixels)
