"""The rendering-feedback envs (svg, chart, cad, html): contract, expert at the maximum, failures with reasons,
hostile code, multi-turn self-correction by hand, seeding, option checks.

Renders go through the process-wide sandbox pools, which stay warm across tests: the first chart test pays the
matplotlib worker's start (about 1 s), the first CAD test the build123d import (about 4 s).
"""

from __future__ import annotations

import math
import os
import re
import uuid

import pytest
import torch

pytest.importorskip("cairosvg")

import sim  # noqa: E402
import sim.render  # noqa: E402,F401  (registers svg, chart and cad)
from sim import check_vec_env  # noqa: E402
from sim.render.envs import CadEnv, ChartEnv, HtmlEnv, SvgEnv, image_similarity, side_by_side  # noqa: E402
from sim.render.targets import Program, Slot, cad_target, chart_target, html_target, svg_target  # noqa: E402

BLANK_SVG = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 64 64"></svg>'
PWNED = f"/tmp/mmrl-pwned-render-env-{uuid.uuid4().hex}"  # unique, so a leftover file cannot fake a pass
# From tests/rewards/test_hostile.py and tests/rewards/test_cad.py: (source, pattern its reason must match).
HOSTILE_SVG = {
    "billion_laughs": (
        '<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">'
        '<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;">]><svg xmlns="http://www.w3.org/2000/svg">&lol3;</svg>',
        "undefined entity",  # the env keeps only <svg>...</svg>, so the DOCTYPE is gone and &lol3; is undefined
    ),
    "css_import": (
        '<svg xmlns="http://www.w3.org/2000/svg"><style>@import url(http://127.0.0.1:1/a.css);</style></svg>',
        "@import",
    ),
    "image_file": (
        '<svg xmlns="http://www.w3.org/2000/svg"><image href="file:///etc/passwd" width="9" height="9"/></svg>',
        "external reference",
    ),
}
HOSTILE_CHART = {
    "infinite_loop": ("while True:\n    pass\n", r"timeout|cpu time"),
    "read_passwd": ("print(open('/etc/passwd').read())\n", r"sandbox refused open\('/etc/passwd'\)"),
    "fork": ("import os\nos.fork()\n", "sandbox refused os.fork"),
    "write_outside": (f"open('{PWNED}', 'w').write('x')\n", "sandbox refused open.*for writing"),
}
HOSTILE_CAD = {
    "read_passwd": ("print(open('/etc/passwd').read())\n", r"sandbox refused open\('/etc/passwd'\)"),
    "socket": ("import socket\nsocket.create_connection(('127.0.0.1', 1), timeout=1)\n", "sandbox refused socket"),
}


@pytest.fixture(autouse=True, scope="module")
def no_pwned_file():
    yield
    assert not os.path.exists(PWNED), "a hostile render wrote outside its sandbox"


def test_import_registers_the_three_envs():
    for name in ("svg", "chart", "cad"):
        assert name in sim.ENVS


# ---------------------------------------------------------------------------------------------------------- svg


def test_svg_contract_with_garbage_and_with_the_expert():
    env = sim.make("svg", num_envs=4)  # defaults only, as tests/sim/test_contract.py builds it
    check_vec_env(env, seed=0)
    env = SvgEnv(num_envs=3, image_size=32, complexity=2, turns=2)
    env.reset(seed=0)
    check_vec_env(env, seed=0, actions=env.expert_action())


def test_svg_expert_scores_the_maximum_and_wrong_answers_less():
    env = SvgEnv(num_envs=4, complexity=3, length_weight=0.1)
    obs = env.reset(seed=3)
    expert = env.expert_action()
    result = env.step(expert)
    torch.testing.assert_close(result.reward, torch.full((4,), 1.1))
    torch.testing.assert_close(result.info["similarity"], torch.ones(4))
    torch.testing.assert_close(result.info["reward_components"]["length"], torch.ones(4))
    assert result.info["success"].all() and result.terminated.all() and not result.truncated.any()
    assert result.info["reasons"] == [""] * 4 and result.info["rendered"].all()
    assert obs.instruction == ["Write SVG code that draws this image."] * 4

    # Fenced and tagged answers are the same answer; another world's scene and an empty canvas score less.
    env.reset(seed=3)
    wrapped = [f"Here:\n```svg\n{expert[0]}\n```", f"<think>hmm</think><answer>{expert[1]}</answer>"]
    result = env.step(wrapped + [expert[0], BLANK_SVG])
    torch.testing.assert_close(result.reward[:2], torch.full((2,), 1.1))
    assert 0 <= result.reward[2] < 0.9
    assert result.info["similarity"][3] == 0 and result.reward[3] == 0  # blank: rescaled to zero, not ~0.7 SSIM
    assert result.info["reasons"][3] == ""  # it rendered: nothing went wrong, it is just wrong


def test_svg_sloppy_expert_is_worse_and_reproducible():
    env = SvgEnv(num_envs=4)
    env.reset(seed=0)
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    assert env.expert_action(0.0, gen) == [t.source for t in env.targets]
    assert torch.equal(gen.get_state(), state)  # noise 0 draws nothing
    sloppy = env.expert_action(0.05, gen)
    assert sloppy == env.expert_action(0.05, torch.Generator().manual_seed(0))
    assert sloppy != env.expert_action(0.05, gen)
    similarity = env.step(sloppy).info["similarity"]
    assert (similarity < 1).all() and similarity.mean() > 0.1, similarity


def test_demonstrations_are_short_in_the_tiny_tokenizer():
    tokenizers = pytest.importorskip("tokenizers")
    path = os.path.join(os.path.dirname(__file__), "..", "..", "assets", "tokenizer", "tokenizer.json")
    tokenizer = tokenizers.Tokenizer.from_file(os.path.abspath(path))
    most = {svg_target: 95, chart_target: 65, cad_target: 32}  # complexity 1, over 20 seeds
    for make, limit in most.items():
        counts = [len(tokenizer.encode(make(seed, 1).source).ids) for seed in range(20)]
        assert max(counts) <= limit, (make.__name__, counts)


def test_unparseable_answers_score_zero_with_a_reason():
    env = SvgEnv(num_envs=5, image_size=32)
    env.reset(seed=1)
    answers = ["", "no idea", "```svg\n<svg", "<answer>[1, 2]</answer>", "<svg><rect</svg>"]
    result = env.step(answers)
    torch.testing.assert_close(result.reward, torch.zeros(5))
    reasons = result.info["reasons"]
    assert all("no <svg>" in r for r in reasons[:4]), reasons
    assert "not well-formed" in reasons[4], reasons
    assert not result.info["rendered"].any() and not result.info["success"].any()


def test_hostile_svg_scores_zero_and_the_env_keeps_working():
    env = SvgEnv(num_envs=4, image_size=32, render_timeout=1.0)
    env.reset(seed=2)
    expert = env.expert_action()
    result = env.step([source for source, _ in HOSTILE_SVG.values()] + [expert[3]])
    for k, (_, pattern) in enumerate(HOSTILE_SVG.values()):
        assert result.reward[k] == 0 and re.search(pattern, result.info["reasons"][k]), result.info["reasons"][k]
    assert result.reward[3] == pytest.approx(1.1)
    env.reset(seed=2)
    torch.testing.assert_close(env.step(expert).reward, torch.full((4,), 1.1))


def test_multi_turn_shows_target_and_render_and_pays_the_formula():
    bonus, length_weight = 0.5, 0.1
    best = 1.0 + length_weight
    env = SvgEnv(num_envs=3, turns=3, improvement_bonus=bonus, length_weight=length_weight)
    start = env.reset(seed=[10, 11, 12])
    targets = start.image.clone()  # [3, H, W, 3]
    expert = env.expert_action()
    sloppy = env.expert_action(0.03, torch.Generator().manual_seed(1))[1]

    # Turn 1: an empty canvas, a sloppy copy, the exact code.
    first = env.step([BLANK_SVG, sloppy, expert[2]])
    partial = float(first.info["similarity"][1])
    assert 0 < partial < 0.9, partial
    score_1 = float(first.info["score"][1])
    torch.testing.assert_close(first.reward, torch.tensor([0.0, score_1, best]))  # no bonus on the first turn
    assert first.terminated.tolist() == [False, False, True] and first.info["success"].tolist() == [False, False, True]
    white = torch.full_like(targets[:1], 255)
    assert torch.equal(first.obs.image[0], side_by_side(targets[:1], white, torch.tensor([True]))[0])
    half = env.image_size // 2
    top = (env.image_size - half) // 2  # a square image scaled to half the width is half as tall, centred
    assert (first.obs.image[0, top : top + half, :half] != 255).any()  # the target's shape
    assert (first.obs.image[0, top : top + half, half:] == 255).all()  # the empty render
    assert first.obs.image[0, 0, 0].tolist() == [128] * 3  # grey padding above the halves
    assert first.obs.instruction[1].startswith(f"Left: target. Right: your render (similarity {partial:.2f}).")
    assert sloppy in first.obs.instruction[1] and "Fix the code." in first.obs.instruction[1]
    assert first.obs.instruction[2] == "Left: target. Right: your render (similarity 1.00)."  # ended: nothing to fix

    # Turn 2: world 0 fixes its code, world 1 breaks it, world 2 has finished and is frozen.
    second = env.step([expert[0], "I give up", "ignored"])
    torch.testing.assert_close(second.reward, torch.tensor([best + bonus * best, -score_1, 0.0]))
    assert second.info["reasons"][1] and second.info["reasons"][2] == ""
    black = torch.zeros_like(targets[1:2])
    assert torch.equal(second.obs.image[1], side_by_side(targets[1:2], black, torch.tensor([False]))[0])
    assert "nothing (no <svg>...</svg> element in the answer)" in second.obs.instruction[1]
    assert torch.equal(second.obs.image[2], first.obs.image[2])
    assert second.terminated.tolist() == [True, False, True]
    torch.testing.assert_close(second.info["reward_components"]["similarity"], torch.tensor([1.0, -partial, 0.0]))

    # Turn 3: world 1 gets it right on its last attempt.
    third = env.step(["ignored", expert[1], "ignored"])
    torch.testing.assert_close(third.reward, torch.tensor([0.0, best + bonus * best, 0.0]))
    assert third.terminated.all() and not third.truncated.any() and third.info["success"].all()

    # The return is the final score plus the bonus on each correction's gain; components sum to final values.
    returns = first.reward + second.reward + third.reward
    torch.testing.assert_close(returns, torch.tensor([best + bonus * best, best + bonus * best, best]))
    similarity = sum(r.info["reward_components"]["similarity"] for r in (first, second, third))
    torch.testing.assert_close(similarity, torch.ones(3))


def test_side_by_side_and_similarity_by_hand():
    left = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    left[..., 0] = 200
    right = torch.full((1, 8, 8, 3), 50, dtype=torch.uint8)
    out = side_by_side(left, right, torch.tensor([True]))
    assert out[0, 2:6, :4].eq(torch.tensor([200, 0, 0], dtype=torch.uint8)).all()
    assert out[0, 2:6, 4:].eq(50).all() and out[0, :2].eq(128).all() and out[0, 6:].eq(128).all()
    failed = side_by_side(left, right, torch.tensor([False]))
    assert failed[0, 2:6, 4:].eq(0).all()

    target = torch.full((2, 32, 32, 3), 255, dtype=torch.uint8)
    target[:, 8:24, 8:24] = torch.tensor([200, 30, 30], dtype=torch.uint8)
    renders = torch.stack([target[0], torch.full_like(target[0], 255)])
    torch.testing.assert_close(
        image_similarity(renders, target, {"ssim": 0.5, "pixel": 0.5}), torch.tensor([1.0, 0.0])
    )


def test_same_seed_same_world_and_seed_plus_k():
    a = SvgEnv(num_envs=3, image_size=32, complexity=2).reset(seed=5)
    b = SvgEnv(num_envs=3, image_size=32, complexity=2).reset(seed=5)
    c = SvgEnv(num_envs=3, image_size=32, complexity=2).reset(seed=6)
    assert torch.equal(a.image, b.image) and a.instruction == b.instruction
    assert torch.equal(c.image[:2], a.image[1:]) and not torch.equal(c.image[2], a.image[0])
    assert svg_target(5, 4).source == svg_target(5, 4).source != svg_target(6, 4).source
    assert cad_target(-3, 2).source == cad_target(-3, 2).source  # any int is a seed


def test_bad_options_name_themselves():
    cases = [
        (SvgEnv, {"image_size": 8}, "image_size"),
        (SvgEnv, {"complexity": 0}, "complexity"),
        (SvgEnv, {"complexity": 13}, r"complexity must be an int in \[1, 12\]"),
        (SvgEnv, {"turns": 0}, "turns"),
        (SvgEnv, {"success_threshold": 1.5}, "success_threshold"),
        (SvgEnv, {"improvement_bonus": -1.0}, "improvement_bonus"),
        (SvgEnv, {"length_weight": math.nan}, "length_weight"),
        (SvgEnv, {"metrics": {"clip": 1.0}}, "metrics"),
        (SvgEnv, {"render_timeout": 0}, "render_timeout"),
        (ChartEnv, {"ocr_weight": -0.5}, "ocr_weight"),
        (ChartEnv, {"complexity": 5}, "complexity"),
        (CadEnv, {"views": ["front", "diagonal"]}, "views"),
        (CadEnv, {"executable_weight": "high"}, "executable_weight"),
    ]
    for cls, options, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            cls(num_envs=2, **options)
    with pytest.raises(ValueError, match="unknown option 'image_sise' for env 'svg'"):
        sim.make("svg", num_envs=2, image_sise=32)
    env = SvgEnv(num_envs=2)
    with pytest.raises(RuntimeError, match=r"worlds \[0, 1\] were never reset"):
        env.step(["", ""])
    env.reset(seed=0)
    with pytest.raises(ValueError, match="1 actions for 2 worlds"):
        env.step([""])
    with pytest.raises(ValueError, match="noise"):
        env.expert_action(-0.1)


def test_program_noise_is_clamped_and_rounded():
    program = Program(("x=", 0, " c=#", 1), (Slot(10.0, 64.0, 0.0, 64.0), Slot(250.0, 255.0, 0.0, 255.0, "hex")))
    assert program.source() == "x=10 c=#fa"
    gen = torch.Generator().manual_seed(0)
    found = [re.fullmatch(r"x=(\d+) c=#([0-9a-f]{2})", program.source(10.0, gen)) for _ in range(30)]
    assert all(found)
    xs = {int(m.group(1)) for m in found}
    channels = {m.group(2) for m in found}
    assert min(xs) == 0 and max(xs) == 64 and {"00", "ff"} <= channels


# -------------------------------------------------------------------------------------------------------- chart


def test_chart_contract_expert_ocr_and_failures():
    env = ChartEnv(num_envs=2, image_size=48, ocr_weight=0.0)
    check_vec_env(env, seed=0)
    env.reset(seed=0)
    check_vec_env(env, seed=0, actions=env.expert_action())

    # Two OCR reads: the expert's chart, and the same chart with every word changed.
    env = ChartEnv(num_envs=2, complexity=3, ocr_weight=0.5, length_weight=0.1)
    env.reset(seed=[4, 4])
    target = env.targets[0]
    assert target.text and all(word in target.source for word in target.text.split())
    expert = env.expert_action()[0]
    renamed = expert
    for word in target.text.split():
        renamed = renamed.replace(f'"{word}"', '"zzz"')
    result = env.step([expert, renamed])
    ocr = result.info["reward_components"]["ocr"]
    assert ocr[0] >= 0.75 and ocr[1] < 0.3, (ocr, target.text)
    torch.testing.assert_close(result.reward[0], 1.0 + 0.5 * ocr[0] + 0.1)
    assert result.info["similarity"][0] == 1 and result.info["similarity"][1] < 1

    # Syntax errors, code without a figure and hostile code: zero, with the reason (line numbers are the policy's).
    env = ChartEnv(num_envs=6, image_size=32, ocr_weight=0.0, render_timeout=1.0)
    env.reset(seed=1)
    answers = ["import matplotlib.pyplot as plt\nplt.bar(", "x = 1", *(s for s, _ in HOSTILE_CHART.values())]
    result = env.step(answers)
    torch.testing.assert_close(result.reward, torch.zeros(6))
    reasons = result.info["reasons"]
    assert reasons[0].startswith("SyntaxError") and "line 2" in reasons[0], reasons[0]
    assert "no matplotlib figure" in reasons[1]
    for k, (_, pattern) in enumerate(HOSTILE_CHART.values(), start=2):
        assert re.search(pattern, reasons[k]), reasons[k]
    env.reset(seed=1)
    torch.testing.assert_close(env.step(env.expert_action()).reward, torch.full((6,), 1.1))


# ---------------------------------------------------------------------------------------------------------- cad


def test_cad_contract_expert_failures_and_hostile_scripts():
    env = sim.make("cad", num_envs=2, image_size=64, complexity=3)
    check_vec_env(env, seed=0)
    obs = env.reset(seed=0)
    assert obs.instruction[0] == "Write a build123d script that builds this part (views: front, right, top, iso)."
    expert = env.expert_action()
    result = env.step(expert)
    torch.testing.assert_close(result.reward, torch.full((2,), 0.2 + 1.0 + 0.1))
    torch.testing.assert_close(result.info["reward_components"]["executable"], torch.ones(2))

    # A box of the wrong size runs (executable) but looks wrong; a bad script and hostile ones score nothing.
    env = CadEnv(num_envs=4, image_size=64, turns=2, render_timeout=2.0)
    env.reset(seed=7)
    sources = [s for s, _ in HOSTILE_CAD.values()]
    wrong = "from build123d import *\nresult = Box(5, 5, 60)\n"
    result = env.step([wrong, "from build123d import *\nresult = Box(1, 1,\n", *sources])
    assert result.info["reward_components"]["executable"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert 0.2 <= result.reward[0] < 1.1 and result.reward[1:].eq(0).all()
    reasons = result.info["reasons"]
    assert reasons[0] == "" and "SyntaxError" in reasons[1]
    for k, (_, pattern) in enumerate(HOSTILE_CAD.values(), start=2):
        assert re.search(pattern, reasons[k]), reasons[k]
    # The second turn fixes every world; the pool survived the hostile scripts.
    second = env.step(env.expert_action())
    assert second.info["success"].all() and second.terminated.all()
    torch.testing.assert_close(second.info["score"], torch.full((4,), 1.3))


# --------------------------------------------------------------------------------------------------------- html


@pytest.mark.skipif(HtmlEnv.unavailable() is not None, reason=str(HtmlEnv.unavailable()))
def test_html_expert_wrong_hostile_answers_and_a_correction_turn():
    env = sim.make("html", num_envs=4, complexity=3, turns=2, render_timeout=5.0)
    obs = env.reset(seed=5)
    assert obs.image.shape == (4, 64, 64, 3) and obs.instruction[0] == "Write HTML that draws this image."
    assert (obs.image != 255).any(dim=-1).flatten(1).any(dim=1).all()  # every target draws something
    expert = env.expert_action()
    assert all(source.startswith(("<div ", "<p ")) for source in expert)
    # A fenced expert answer, an empty page, an infinite loop and a page that navigates away.
    answers = [
        f"```html\n{expert[0]}\n```",
        "<p></p>",
        "<script>for (;;) {}</script>",
        "<script>location='/x'</script>",
    ]
    first = env.step(answers)
    assert first.reward[0] == pytest.approx(1.1) and first.terminated[0]
    assert first.reward[1] == 0 and first.info["reasons"][1] == ""  # rendered, but blank: similarity 0
    assert first.reward[2:].eq(0).all() and "timeout" in first.info["reasons"][2]
    assert "navigated away" in first.info["reasons"][3]
    assert "did not render" in first.obs.instruction[2] and "Fix the code." in first.obs.instruction[2]
    # The second turn fixes every world still running: the pool survived the hostile pages.
    second = env.step(env.expert_action())
    torch.testing.assert_close(second.reward[1:], torch.full((3,), 1.1 + 0.5 * 1.1))
    assert second.info["success"].all() and second.terminated.all()


def test_html_targets_are_seeded_and_zoom_with_the_image():
    assert html_target(3, 5).source == html_target(3, 5).source != html_target(4, 5).source
    assert html_target(3, 1).source.count("<div") == 1 and html_target(3, 8).source.count("style=") == 8
    if HtmlEnv.unavailable() is None:
        env = HtmlEnv(num_envs=1, image_size=128)
        assert env.wrap("<b>").startswith("<style>html{zoom:2}</style><style>")
