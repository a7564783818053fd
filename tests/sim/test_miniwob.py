"""The `miniwob` env: MiniWoB++ pages in a real headless Chromium, cut off from the network.

The tests share one env of 4 browsers (a browser takes 1-3 s to start here); a seed picks the task
(`tasks[seed % len(tasks)]`), so the seeds below are chosen by the task they give.
"""

import http.server
import socket
import threading
import time

import pytest
import torch

import sim
from sim import check_vec_env
from sim.gui.miniwob import MiniWoBEnv

REASON = MiniWoBEnv.unavailable()
needs_browser = pytest.mark.skipif(REASON is not None, reason=REASON or "")

TASKS = (
    "click-button",
    "enter-text",
    "click-checkboxes",
    "login-user",
    "choose-list",
    "use-autocomplete",
    "scroll-text",
)
N = 4


def _seeds(task: str, count: int) -> list[int]:
    """`count` seeds whose episodes are of `task`."""
    k = TASKS.index(task)
    return [k + len(TASKS) * j for j in range(count)]


@pytest.fixture(scope="module")
def env():
    env = sim.make("miniwob", num_envs=N, tasks=TASKS, image_size=128)
    yield env
    env.close()


def _driver(env, world: int):
    return env.worlds[world].instance.driver


def _click_on(env, world: int, element) -> str:
    x, y = env.to_image(element.left + element.width / 2, element.top + element.height / 2)
    return f"click({round(x)}, {round(y)})"


def _element(env, world: int, tag: str, text: str | None = None):
    for e in env._doms[world].subtree_elements:
        if e.tag == tag and (text is None or (e.text or "").strip() == text):
            return e
    raise AssertionError(f"no {tag} {text!r} on the page of world {world}")


@needs_browser
def test_contract(env):
    check_vec_env(env, seed=0)


@needs_browser
def test_same_seed_same_page_in_every_browser(env):
    seed = _seeds("click-checkboxes", 2)[1]
    obs = env.reset(seed=[seed] * N)  # a GRPO group: four browsers, one seed
    assert len(set(obs.instruction)) == 1 and obs.instruction[0].startswith("Select")
    assert all(torch.equal(obs.image[0], obs.image[k]) for k in range(1, N))
    other = env.reset(seed=[seed + len(TASKS)] * N)  # same task, another seed
    assert other.instruction[0] != obs.instruction[0]
    assert not torch.equal(other.image[0], obs.image[0])
    assert env.task_names == ["click-checkboxes"] * N


@needs_browser
def test_clicking_the_named_button_succeeds_and_another_fails(env):
    env.reset(seed=_seeds("click-button", N))
    target = env._obs[0]["fields"][0][1]
    for seed in _seeds("click-button", 20):  # a page for world 1 with a button other than the named one
        env.reset(seed=[seed], env_ids=[1])
        others = [
            e for e in env._doms[1].subtree_elements if e.tag == "button" and e.text != env._obs[1]["fields"][0][1]
        ]
        if others:
            break
    wrong = others[0]
    result = env.step([_click_on(env, 0, _element(env, 0, "button", target)), _click_on(env, 1, wrong), "", ""])
    assert result.info["success"].tolist()[:2] == [True, False]
    assert result.reward.tolist()[:2] == [1.0, -1.0]  # MiniWoB's raw reward
    assert result.terminated.tolist() == [True, True, False, False]
    frozen = env.step(["finish()"] * N)  # ended worlds ignore their action and repeat their outcome
    assert frozen.reward[:2].tolist() == [0.0, 0.0] and frozen.info["success"][:2].tolist() == [True, False]


@needs_browser
def test_typing_lands_in_the_focused_input_and_keys_edit_it(env):
    env.reset(seed=_seeds("enter-text", N))
    field = _element(env, 0, "input_text")
    env.step([_click_on(env, 0, field), 'type("abc")', "", ""])  # world 1: nothing focused, typing goes nowhere
    env.step(['type("héllo")', 'type("abc")', "press(enter)", "scroll(left)"])
    assert _driver(env, 0).execute_script("return document.getElementById('tt').value;") == "héllo"
    assert _driver(env, 1).execute_script("return document.getElementById('tt').value;") == ""
    assert env._doms[0].subtree_elements[0] is not None and _element(env, 0, "input_text").value == "héllo"
    result = env.step(["press(backspace)", "press(nosuchkey)", "long_press(3, 4)", "no action here"])
    assert _driver(env, 0).execute_script("return document.getElementById('tt').value;") == "héll"
    assert "nosuchkey" in result.info["reasons"][1] and result.info["reasons"][3]
    assert not result.terminated.any()


@needs_browser
def test_scrolling_turns_the_wheel_over_the_page(env):
    env.reset(seed=_seeds("scroll-text", N))
    top = "return document.querySelector('textarea').scrollTop;"
    assert _driver(env, 0).execute_script(top) == 0
    env.step(["scroll(down)", "scroll(up)", "", ""])
    assert _driver(env, 0).execute_script(top) > 0
    assert _driver(env, 1).execute_script(top) == 0


@needs_browser
def test_finish_ends_the_episode_without_success(env):
    env.reset(seed=0)
    result = env.step(["finish()"] * N)
    assert result.terminated.all() and not result.info["success"].any() and not result.truncated.any()


@needs_browser
def test_episodes_are_truncated_after_max_episode_steps(env):
    env.reset(seed=0)
    for _ in range(env.max_episode_steps - 1):
        assert not env.step([""] * N).truncated.any()
    result = env.step([""] * N)
    assert result.truncated.all() and not result.terminated.any()


@needs_browser
@pytest.mark.parametrize("task", ["click-checkboxes", "login-user", "choose-list", "use-autocomplete"])
def test_expert_solves_the_task(env, task):
    env.reset(seed=_seeds(task, N))
    returns = torch.zeros(N)
    for _ in range(env.max_episode_steps):
        result = env.step(env.expert_action())
        returns += result.reward
        if (result.terminated | result.truncated).all():
            break
    assert result.info["success"].all(), result.info["reasons"]
    assert returns.tolist() == [1.0] * N


@needs_browser
def test_noisy_expert_needs_a_generator_and_moves_clicks(env):
    env.reset(seed=_seeds("click-button", N))
    with pytest.raises(ValueError, match="Generator"):
        env.expert_action(noise=0.5)
    clean = env.expert_action()
    noisy = env.expert_action(noise=0.5, generator=torch.Generator().manual_seed(0))
    assert all(c.startswith("click(") for c in clean + noisy) and clean != noisy


class _Counter(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self):  # noqa: N802 (the name http.server calls)
        type(self).hits.append(self.path)
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@needs_browser
def test_the_browser_cannot_reach_even_a_server_on_this_machine(env):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Counter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        # The server works: a request from this process reaches it (so the assertion below could fail).
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        assert opener.open(f"http://127.0.0.1:{port}/control", timeout=5).read() == b"ok"
        assert _Counter.hits == ["/control"]
        env.reset(seed=0)
        for host in ("127.0.0.1", "localhost", "example.com"):
            url = f"http://{host}:{port}/from-browser"
            outcome = _driver(env, 0).execute_async_script(
                "var done = arguments[arguments.length - 1];"
                "var img = new Image(); img.src = arguments[0] + '-img';"
                "fetch(arguments[0]).then(r => done('reached ' + r.status)).catch(e => done('blocked: ' + e));",
                url,
            )
            assert outcome.startswith("blocked"), (host, outcome)
        time.sleep(0.3)  # the image request, had it gone out
        assert _Counter.hits == ["/control"]
    finally:
        server.shutdown()
        server.server_close()


def test_without_the_browser_make_says_what_is_missing(monkeypatch):
    monkeypatch.setenv("MMRL_CHROMIUM", "/nonexistent/chromium")
    reason = MiniWoBEnv.unavailable()
    assert "/nonexistent/chromium" in reason and "make setup-browser" in reason
    with pytest.raises(RuntimeError, match="make setup-browser"):
        sim.make("miniwob", num_envs=1)
