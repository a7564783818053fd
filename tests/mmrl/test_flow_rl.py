"""The flow policy's RL machinery beyond Flow-SDE: Flow-Noise's learned noise head (its log-density by hand, recorded =
recomputed, gradients reach the head, ratios 1 at lr 0) and the critic with GAE on a flow policy (values read, the
value loss falls on a fixed batch, checkpoints round-trip)."""

import contextlib
import io
import json
import math

import pytest
import torch

from mmrl.policy.flow import NOISE_HEAD_FILE, NOISE_STD_RANGE, FlowPolicy, NoiseHead, build_tiny_flow, sde_schedule
from mmrl.types import Sampling
from sim.base import Observation

STATS = ((0.0, 0.0, 0.0, 0.0), (0.1, 0.1, 0.2, 0.2), (0.1, -0.1), (0.5, 0.4))
RUN = (
    "model.path=tiny:pi0", "env.name=reach", "env.options={image_size: 64, camera: ego}", "env.eval_metric=success",
    "sft.episodes=8", "sft.steps=2", "sft.batch_size=8", "algo.group_size=2", "trainer.prompts_per_step=2",
    "trainer.eval_episodes=2", "trainer.eval_batch_size=2", "trainer.save_every=1", "trainer.threads=1",
)  # fmt: skip


def _obs(n: int = 4, seed: int = 0) -> Observation:
    gen = torch.Generator().manual_seed(seed)
    return Observation(
        image=torch.randint(0, 256, (n, 48, 48, 3), generator=gen, dtype=torch.uint8),
        instruction=[f"move the gripper to the {c} disc" for c in ("red", "green", "blue", "yellow")[:n]],
        proprio=torch.randn(n, 4, generator=gen) * 0.1,
    )


def _noisy(seed: int = 0) -> FlowPolicy:
    from mmrl.policy.flow import FlowStats

    return build_tiny_flow(seed=seed, stats=FlowStats(*STATS), noise_method="flow_noise")


def _train(tiny_run_config, out, *overrides):
    from mmrl.trainer import train

    pytest.importorskip("mujoco")
    cfg = tiny_run_config(out, *RUN, *overrides)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return train(cfg)


# ---------------------------------------------------------------------------------------------- Flow-Noise
def test_noise_head_stays_in_its_range_and_starts_at_the_geometric_mean():
    head = NoiseHead(8, 3, width=4, std_range=(0.1, 0.4), seed=0)
    hidden = torch.randn(2, 5, 8)
    torch.testing.assert_close(head(hidden), torch.full((2, 5, 3), 0.2))  # sqrt(0.1 * 0.4): the last layer is 0
    with torch.no_grad():
        head.net[2].bias.fill_(100.0)
    torch.testing.assert_close(head(hidden), torch.full((2, 5, 3), 0.4))  # tanh saturates at the top of the range
    with pytest.raises(ValueError, match="std range"):
        NoiseHead(8, 3, std_range=(0.2, 0.1))


def test_flow_noise_log_density_by_hand_recorded_equals_recomputed_and_the_head_learns():
    policy = _noisy()
    assert policy.model.noise_head is not None
    rollout = policy.generate(_obs(2), 1, Sampling(), generator=torch.Generator().manual_seed(0))
    assert rollout.noise_method == "flow_noise" and rollout.completion_mask.all() and rollout.logprobs.shape == (2, 4)
    # Step 1 of row 0 by hand: mean = x + v dt (the ODE step), std = the head's per position and dimension, and the
    # density a Gaussian written here over the C x D executed dimensions (D = 2 of the padded A = 4).
    step, d = 1, 2
    times, _, dt = sde_schedule(4, 0.0)
    inputs = {
        "input_ids": rollout.prompt_ids[:1], "attention_mask": rollout.prompt_mask[:1],
        "pixel_values": rollout.pixel_values[:1], "pixel_attention_mask": rollout.pixel_attention_mask[:1],
    }  # fmt: skip
    with torch.no_grad():
        cache = policy.prefix_cache(inputs)
        x = rollout.chain[:1, step]
        v, hidden = policy.velocity(cache, inputs["attention_mask"], rollout.state[:1], x, times[step:step + 1],
                                    with_hidden=True)  # fmt: skip
        std = policy.model.noise_head(hidden)[0, :, :d]
    mean, y = (x + v * dt)[0, :, :d], rollout.chain[0, step + 1, :, :d]
    low, high = NOISE_STD_RANGE
    assert (std >= low - 1e-6).all() and (std <= high + 1e-6).all()
    expected = sum(
        -((y[c, j] - mean[c, j]) ** 2) / (2 * std[c, j] ** 2) - math.log(std[c, j]) - 0.5 * math.log(2 * math.pi)
        for c in range(4) for j in range(d)
    )  # fmt: skip
    torch.testing.assert_close(rollout.logprobs[0, step], torch.tensor(float(expected)), rtol=0, atol=1e-4)
    # Recomputed under the same weights: the recorded values, with gradients reaching the noise head.
    scored, entropy = policy.logprobs(rollout, with_entropy=True)
    torch.testing.assert_close(scored.detach(), rollout.logprobs, rtol=0, atol=1e-4)
    (scored.sum() + entropy.sum()).backward()
    assert policy.model.noise_head.net[2].weight.grad.abs().sum() > 0
    assert policy.model.action_out_proj.weight.grad.abs().sum() > 0
    # The entropy is the head's: sum over C x D of (log(2 pi e) / 2 + log std); it starts at the range's middle.
    start = 8 * (0.5 * math.log(2 * math.pi * math.e) + 0.5 * math.log(low * high))
    torch.testing.assert_close(entropy.detach(), torch.full((2, 4), start), rtol=0, atol=1e-4)
    # Greedy evaluation is the ODE: nothing sampled, no density.
    greedy = policy.generate(_obs(2), 1, Sampling(temperature=0.0), generator=torch.Generator().manual_seed(0))
    assert not greedy.completion_mask.any()
    torch.testing.assert_close(policy.logprobs(greedy), torch.zeros(2, 4))
    # A Flow-SDE policy does not score Flow-Noise chains (their densities differ), naming the field.
    with pytest.raises(ValueError, match="noise_method 'flow_noise'"):
        build_tiny_flow(stats=policy.stats).logprobs(rollout)


def test_flow_noise_head_round_trips_with_the_checkpoint_and_the_model_folder_stays_plain_pi0(tmp_path):
    from transformers import PI0ForConditionalGeneration

    from mmrl.policy import load_policy
    from mmrl.runtime.config import ModelConfig, load_config

    policy = _noisy()
    with torch.no_grad():
        policy.model.noise_head.net[2].bias.normal_()  # away from its zero start, so the round trip could fail
    policy.save_pretrained(tmp_path / "noisy")
    assert (tmp_path / "noisy" / NOISE_HEAD_FILE).exists()
    assert json.loads((tmp_path / "noisy" / "processor_config.json").read_text())["noise_method"] == "flow_noise"
    plain = PI0ForConditionalGeneration.from_pretrained(tmp_path / "noisy")  # no unexpected noise_head keys
    assert not any(k.startswith("noise_head") for k in plain.state_dict())
    loaded = load_policy(ModelConfig(path=str(tmp_path / "noisy")))
    assert loaded.noise_method == "flow_noise"
    for name, weight in policy.model.state_dict().items():
        assert torch.equal(weight, loaded.model.state_dict()[name]), name
    a = policy.generate(_obs(2), 1, Sampling(), generator=torch.Generator().manual_seed(5))
    b = loaded.generate(_obs(2), 1, Sampling(), generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.chain, b.chain) and torch.equal(a.logprobs, b.logprobs)
    # The config field selects it: a fresh head on a Flow-SDE policy, one denoising step allowed (no infinite sigma).
    cfg = load_config(None, ["model.path=tiny:pi0", "model.flow.noise_method=flow_noise", "model.flow.steps=1"])
    one = load_policy(cfg.model).apply_options(cfg.model)
    assert one.noise_method == "flow_noise" and one.num_steps == 1 and one.model.noise_head is not None
    one.set_stats(policy.stats)
    assert one.generate(_obs(2), 1, Sampling(), generator=torch.Generator().manual_seed(0)).logprobs.shape == (2, 1)


def test_flow_noise_and_a_critic_train_on_reach_ratios_one_at_lr_zero(tiny_run_config, tmp_path):
    """One run at lr 0 with two epochs: every ratio is 1 (recorded = recomputed through the trainer), the critic reads
    values and trains (explained variance finite, its head moved), and the checkpoint carries head and critic."""
    from mmrl.runtime.checkpoint import load_training_state

    overrides = ("trainer.total_steps=1", "algo.ppo_epochs=2", "algo.mini_batch_groups=1", "trainer.lr=0",
                 "model.flow.noise_method=flow_noise", "algo.advantage=gae", "algo.critic.lr=1e-2")  # fmt: skip
    metrics = _train(tiny_run_config, tmp_path / "run", *overrides)
    step = next(m for m in metrics if "loss/policy" in m)
    assert step["optimizer_steps"] == 4 and step["clip_fraction"] == 0.0
    assert abs(step["ratio/max"] - 1) < 1e-4 and abs(step["ratio/min"] - 1) < 1e-4
    assert math.isfinite(step["critic/explained_variance"]) and step["critic/grad_norm"] > 0
    last = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    assert (last / NOISE_HEAD_FILE).exists()
    _, states = load_training_state(last)
    head = states["critic"]["head"]
    assert any(v.abs().sum() > 0 for k, v in head.items() if k.startswith("net.2."))  # the zero-started layer moved


# ---------------------------------------------------------------------------------------------- the critic
def test_a_critic_reads_flow_values_its_loss_falls_on_a_fixed_batch_and_it_round_trips():
    from mmrl.methods.critic import Critic
    from mmrl.policy.flow import FlowStats
    from mmrl.runtime.distributed import World

    policy = build_tiny_flow(seed=0, stats=FlowStats(*STATS))
    obs = _obs(4)
    rollout = policy.generate(obs, 1, Sampling(), generator=torch.Generator().manual_seed(0))
    critic = Critic(policy.value_input(policy.model), width=16, lr=3e-2, trunk_grad=False, seed=0, device="cpu")
    # The head reads the backbone's pooled prompt state joined with the normalised proprio: H + Smax features.
    assert critic.head.net[0].in_features == 64 + 8
    targets = torch.tensor([1.0, -1.0, 0.5, 0.0])
    losses = []
    for _ in range(30):
        with critic.reading():
            policy.logprobs(rollout)
        values = critic.values()
        assert values.shape == (4,)
        loss = (values - targets).square().mean()
        loss.backward()
        critic.step(World(), max_norm=10.0)
        losses.append(float(loss.detach()))
    assert losses[0] == pytest.approx(float(targets.square().mean()))  # every value starts at 0
    assert losses[-1] < 0.2 * losses[0]
    assert all(p.grad is None for p in policy.model.parameters())  # the trunk's features were detached
    # Values depend on the state only, not on the sampled chain: another draw of chains reads the same values.
    other = policy.generate(obs, 1, Sampling(), generator=torch.Generator().manual_seed(9))
    with torch.no_grad(), critic.reading():
        policy.logprobs(other)
        again = critic.values()
    with torch.no_grad(), critic.reading():
        policy.logprobs(rollout)
        torch.testing.assert_close(critic.values(), again)
    # A checkpoint of the critic restores the same values (and its optimiser).
    fresh = Critic(policy.value_input(policy.model), width=16, lr=3e-2, trunk_grad=False, seed=1, device="cpu")
    fresh.load_state_dict(critic.state_dict())
    with torch.no_grad(), fresh.reading():
        policy.logprobs(rollout)
        torch.testing.assert_close(fresh.values(), again, rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- LoRA
@pytest.mark.parametrize("part", ["expert", "backbone"])
def test_lora_on_one_part_trains_its_adapters_and_freezes_the_other(part):
    from mmrl.policy.flow import FlowStats
    from mmrl.runtime.config import LoRAConfig, ModelConfig

    pytest.importorskip("peft")
    policy = build_tiny_flow(seed=0, stats=FlowStats(*STATS), noise_method="flow_noise")
    policy.apply_options(ModelConfig(path="tiny:pi0", lora=LoRAConfig(r=4, target_modules=part)))
    chosen, other = ("model.dit.", "model.vlm.") if part == "expert" else ("model.vlm.language_model.", "model.dit.")
    named = dict(policy.net.named_parameters())
    adapters = {k: v for k, v in named.items() if "lora_" in k}
    assert adapters and all(k.startswith(chosen) and v.requires_grad for k, v in adapters.items())
    trainable = {k for k, v in named.items() if v.requires_grad}
    assert trainable == set(adapters) | {k for k in named if k.startswith("noise_head.")}
    rollout = policy.generate(_obs(2), 1, Sampling(), generator=torch.Generator().manual_seed(0))
    policy.logprobs(rollout).sum().backward()
    # lora_B starts at 0, so lora_A's gradient is 0 at first; lora_B's is not, in the chosen part only.
    assert any(v.grad is not None and v.grad.abs().sum() > 0 for k, v in adapters.items() if "lora_B" in k)
    assert all(v.grad is None for k, v in named.items() if k.startswith(other))
    assert policy.net.noise_head.net[2].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="model.lora.target_modules 'vision'"):
        build_tiny_flow().apply_options(ModelConfig(path="tiny:pi0", lora=LoRAConfig(r=4, target_modules="vision")))


def test_lora_checkpoint_round_trips_and_export_writes_the_merged_weights(tmp_path):
    from transformers import PI0ForConditionalGeneration

    from mmrl.export import export
    from mmrl.policy import load_policy
    from mmrl.policy.flow import FlowStats
    from mmrl.policy.lora import is_lora
    from mmrl.runtime.config import LoRAConfig, ModelConfig

    pytest.importorskip("peft")
    policy = build_tiny_flow(seed=0, stats=FlowStats(*STATS))
    base = {k: v.clone() for k, v in policy.net.state_dict().items()}
    policy.apply_options(ModelConfig(path="tiny:pi0", lora=LoRAConfig(r=4, target_modules="expert")))
    with torch.no_grad():  # adapters away from B = 0, so merging changes the expert's weights
        for name, param in policy.net.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    policy.save_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "lora").is_dir()
    loaded = load_policy(ModelConfig(path=str(tmp_path / "ckpt")))
    assert is_lora(loaded)
    obs, greedy = _obs(2), Sampling(temperature=0.0)
    a = policy.generate(obs, 1, Sampling(), generator=torch.Generator().manual_seed(1))
    b = loaded.generate(obs, 1, Sampling(), generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.chain, b.chain) and torch.equal(a.logprobs, b.logprobs)
    # Export merges: plain transformers loads a PI0 whose ODE samples are the adapted policy's.
    export(tmp_path / "ckpt", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "mmrl_export.json").read_text())["lora_merged"] is True
    assert not (tmp_path / "out" / "lora").exists()
    merged = PI0ForConditionalGeneration.from_pretrained(tmp_path / "out")
    weights = merged.state_dict()
    assert weights.keys() == base.keys() - {k for k in base if k.startswith("noise_head")}
    assert all(torch.equal(weights[k], base[k]) for k in weights if not k.startswith("model.dit."))
    assert any(not torch.equal(weights[k], base[k]) for k in weights if k.startswith("model.dit."))
    exported = load_policy(ModelConfig(path=str(tmp_path / "out")))
    assert not is_lora(exported)
    ref = policy.generate(obs, 1, greedy, generator=torch.Generator().manual_seed(2))
    out = exported.generate(obs, 1, greedy, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(out.actions, ref.actions, rtol=0, atol=1e-5)


def test_a_lora_run_on_the_expert_moves_only_its_adapters_and_mmrl_export_merges_them(tiny_run_config, tmp_path):
    from mmrl.cli import main
    from mmrl.policy.lora import is_lora

    pytest.importorskip("peft")
    overrides = ("trainer.total_steps=1", "trainer.lr=1e-2", "model.lora.r=4", "model.lora.target_modules=expert",
                 "model.flow.noise_method=flow_noise")  # fmt: skip
    _train(tiny_run_config, tmp_path / "run", *overrides)
    start = FlowPolicy.from_pretrained(tmp_path / "run" / "cold_start")
    last = FlowPolicy.from_pretrained(sorted((tmp_path / "run" / "checkpoints").iterdir())[-1])
    # The cold start and RL both train the adapters (and the noise head); the base weights stay the random init's.
    assert is_lora(last) and is_lora(start)
    init = build_tiny_flow(seed=0).net.state_dict()
    begun, ended = start.net.state_dict(), last.net.state_dict()
    adapters = {k for k in ended if "lora_" in k}
    assert adapters and all(k.startswith("model.dit.") for k in adapters)
    assert any(not torch.equal(ended[k], begun[k]) for k in adapters if "lora_B" in k)  # RL moved them
    for name, weight in ended.items():
        if name not in adapters and not name.startswith("noise_head."):
            assert torch.equal(weight, init[name.replace(".base_layer.", ".")]), name
    assert any(not torch.equal(ended[k], begun[k]) for k in ended if k.startswith("noise_head."))
    assert main(["export", str(tmp_path / "run"), str(tmp_path / "out")]) == 0
    exported = FlowPolicy.from_pretrained(tmp_path / "out")
    assert not is_lora(exported) and exported.noise_method == "flow_noise"
    for name, weight in exported.net.state_dict().items():
        if name.startswith("model.vlm."):
            assert torch.equal(weight, init[name]), name  # the backbone had no adapters
    obs, greedy = _obs(2), Sampling(temperature=0.0)
    ref = last.generate(obs, 1, greedy, generator=torch.Generator().manual_seed(2))
    out = exported.generate(obs, 1, greedy, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(out.actions, ref.actions, rtol=0, atol=1e-5)
    assert not torch.equal(
        out.actions, start.generate(obs, 1, greedy, generator=torch.Generator().manual_seed(2)).actions
    )


# ---------------------------------------------------------------------------------------------- refill and shards
def test_refill_generation_shards_and_asynchronous_collection_take_flow_rollouts(tiny_run_config, tmp_path):
    """Two shards a batch and a difficulty filter nothing passes (the tiny π0 never succeeds): both batches are
    sampled, their four shards' flow rollouts joined (`FlowRollout.cat_rows`), and the step trains on the first; the
    collector thread plays it with a copy of the policy (`trainer.max_staleness=1`)."""
    overrides = ("trainer.total_steps=1", "trainer.lr=1e-3", "trainer.generation_shards=2", "algo.difficulty_low=0.5",
                 "algo.max_sample_batches=2", "trainer.max_staleness=1")  # fmt: skip
    metrics = _train(tiny_run_config, tmp_path / "run", *overrides)
    step = next(m for m in metrics if "loss/policy" in m)
    assert step["data/sampled_batches"] == 2 and step["data/kept_groups"] == 0
    assert math.isfinite(step["loss/policy"]) and step["reward/success"] == 0
    assert step["pipeline/dropped_groups"] == 0
