"""Time one GRPO optimiser step of mmrl against TRL's `GRPOTrainer`, doing the same work, side by side.

Both sides train the same tiny random Qwen2-VL (same seed, same weights) on the same grounding prompts (the same
world seeds at every step), with 8 prompts x 8 completions x exactly 32 new tokens, 112 px images, the grounding
env's reward (IoU + format), one forward/backward over the 64 rows, gradient clipping and one AdamW step. Runs of
the two sides alternate within every round, so slow phases of a noisy machine hit both. See bench/README.md.

    .venv/bin/python bench/grpo_step.py --repeats 5 [--json out.json] [--variants matched,kl,trl_defaults]

On a GPU, the real size (BENCHMARKS.md, "GPU figures"; peak GPU memory of each run is reported too):

    python bench/grpo_step.py --model random:qwen2_5_vl_3b --device cuda --dtype bfloat16 --repeats 3 --variants matched

`--model` is `tiny:<arch>` for any tiny model of `mmrl.policy.vlm.tiny` (default `tiny:qwen2_vl`; `tiny:qwen3_5`,
`tiny:gemma3`, `tiny:idefics3` (SmolVLM), `tiny:smolvlm` (SmolVLM2), ...), each family through its own processor
and chat template on both sides, or `random:qwen2_5_vl_3b`: the real Qwen2.5-VL-3B architecture with random weights
and the tiny tokenizer (bench/generation.py; nothing is downloaded), the same weights on both sides. Where TRL
cannot run a family on this machine (its processor cannot be built), the output says why and times mmrl alone.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

# Before transformers, TRL and tqdm are imported: no hub, no progress bars, quiet tokenizers.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")  # mmrl's loop bar; tqdm >= 4.66 reads TQDM_* defaults from the env
os.environ.setdefault("MPLBACKEND", "Agg")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402

import sim  # noqa: E402
from mmrl.policy import build_tiny  # noqa: E402
from mmrl.policy.vision import to_pil  # noqa: E402
from mmrl.policy.vlm.tiny import ALL_TINY_ARCHS, ASSETS, FAMILY_ARCHS, tiny_processor  # noqa: E402
from mmrl.runtime.config import AlgoConfig, EnvConfig, ModelConfig, SamplingConfig, TrainConfig, TrainerConfig  # noqa: E402
from mmrl.trainer import train  # noqa: E402
from rewards import box_iou, format_reward, parse_boxes  # noqa: E402
from sim.seeds import train_seeds  # noqa: E402

# ----------------------------------------------------------------------------------------------- THE WORK
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class ModelSpec:
    """The model both sides train (`--model`, `--device`, `--dtype`)."""

    name: str = "tiny:qwen2_vl"
    device: str = "cpu"
    dtype: str = "float32"

    @property
    def arch(self) -> str:
        """The tiny architecture (`tiny:<arch>`), or Qwen2.5-VL's for the random 3B (whose tokenizer is the tiny one)."""
        return self.name.split(":", 1)[1] if self.name.startswith("tiny:") else "qwen2_5_vl"


SPEC = ModelSpec()  # set by main()


def make_policy(**policy_kwargs):
    """The benchmarked model on `SPEC.device` in `SPEC.dtype`, the same weights at every call (seed 0)."""
    if SPEC.name == "random:qwen2_5_vl_3b":
        from generation import random_qwen2_5_vl_3b  # bench/generation.py (this script's folder is on sys.path)

        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if SPEC.device.startswith("cuda") else []):
            torch.manual_seed(0)
            return random_qwen2_5_vl_3b(SPEC.device, DTYPES[SPEC.dtype], **policy_kwargs)
    if not SPEC.name.startswith("tiny:") or SPEC.arch not in ALL_TINY_ARCHS:
        raise SystemExit(
            f"unknown --model {SPEC.name!r}: tiny:<arch> ({', '.join(ALL_TINY_ARCHS)}) or random:qwen2_5_vl_3b"
        )
    policy = build_tiny(SPEC.arch, seed=0, **policy_kwargs)
    policy.model.to(device=SPEC.device, dtype=DTYPES[SPEC.dtype])
    return policy


def peak_memory_gb() -> float | None:
    """Peak GPU memory allocated since the last reset, in GB (None on the CPU)."""
    return torch.cuda.max_memory_allocated() / 1e9 if SPEC.device.startswith("cuda") else None


def release_memory() -> float | None:
    """Free what the finished run left (TRL's trainer sits in reference cycles that only the cycle collector frees)
    and return the GPU memory still allocated, GB (None on the CPU). Without this, a run that followed a TRL run
    counted TRL's weights and AdamW state (22.7 GB at 3B) in its own peak."""
    gc.collect()
    if not SPEC.device.startswith("cuda"):
        return None
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated() / 1e9


def reset_peak_memory() -> None:
    if SPEC.device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


PROMPTS = 8  # B prompts per optimiser step
GROUP_SIZE = 8  # G completions per prompt
NEW_TOKENS = 32  # L, forced on both sides (EOS is masked until then, and generation stops there)
IMAGE_SIZE = 112
TEMPLATE = "{instruction} Answer as <answer>[x1,y1,x2,y2]</answer>."
LR = 1e-5  # irrelevant to timing; equal on both sides anyway
KL_BETA = 0.04  # the KL coefficient of the GRPO paper (DeepSeekMath), for the "kl" variant
VARIANTS = ("matched", "kl", "trl_defaults", "hf_generate")
MMRL_HF = "mmrl, generate on hf"
TRL_DEFAULTS = "trl defaults (gc on, fused adamw)"


@dataclass
class Run:
    """One configuration of one side; every round runs each configured `Run` once."""

    name: str
    side: str  # "mmrl" or "trl"
    beta: float = 0.0  # KL coefficient (mmrl: algo.kl_coef; TRL: beta)
    gradient_checkpointing: bool = False  # TRL only; mmrl has none
    optim: str = "adamw_torch"  # TRL only; "adamw_torch" is the torch.optim.AdamW that mmrl uses
    backend: str = "lean"  # mmrl only: model.generation_backend
    samples: list[dict] = field(default_factory=list)  # one dict per timed step, over all rounds
    round_medians: list[float] = field(default_factory=list)


def world_seeds(steps: int) -> list[list[int]]:
    """The B world seeds of each step, as `mmrl.trainer.train` (trainer.seed=0) draws them."""
    return [train_seeds(step, PROMPTS, 1) for step in range(steps)]


def _env_reward_weights() -> tuple[float, float]:
    env = sim.make("grounding", num_envs=1, image_size=IMAGE_SIZE)
    return env.iou_weight, env.format_weight


IOU_WEIGHT, FORMAT_WEIGHT = _env_reward_weights()  # the env's defaults, which mmrl's side uses


def grounding_reward(completions, target_box, **kwargs) -> list[float]:
    """TRL reward function computing exactly `GroundingEnv.step`'s reward: iou_weight * IoU + format_weight * format."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    boxes, _ = parse_boxes(texts)  # [R, 4], NaN rows where unparsed
    iou = box_iou(boxes, torch.tensor(target_box, dtype=torch.float32))  # [R]
    reward = IOU_WEIGHT * iou + FORMAT_WEIGHT * format_reward(texts)  # [R]
    return reward.tolist()


class NoTRL(Exception):
    """Why TRL's `GRPOTrainer` cannot run the benchmarked family here; `main` prints it and times mmrl alone."""


def image_only_processor():
    """The family's real `transformers` processor (a `ProcessorMixin`, which TRL requires for VLMs), image-only where
    the family's processor also takes a video processor.

    Workaround, local to this benchmark: transformers 5 builds the Qwen-VL, Qwen3.5 and SmolVLM2 processors only with
    a video processor, and the video processors need torchvision, which has no CPU build on the package index; even
    `video_processor=None` fails the class check. `ProcessorMixin` takes its sub-processors from the names in
    `__init__`'s signature, so a subclass whose `__init__` names only `image_processor` and `tokenizer` builds an
    image-only processor: it runs the family's own `__init__` (which sets the image tokens) with no video processor,
    which `ProcessorMixin.__init__` then drops. `main` checks that it tokenises prompts to exactly the ids and
    pixels mmrl's policy uses.

    Raises:
        NoTRL: where the family's processor cannot be built on this machine (the reason names what is missing).
    """
    import inspect

    import transformers
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(SPEC.arch)
    base = getattr(transformers, name, None) if isinstance(name, str) else None
    if base is None:
        raise NoTRL(f"transformers {transformers.__version__} has no processor class for {SPEC.arch}")
    cls = base
    if "video_processor" in inspect.signature(base.__init__).parameters:

        class ImageOnly(base):
            def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
                base.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

        cls = ImageOnly
    parts = tiny_processor(SPEC.arch)  # left padding, as TRL pads prompts
    settings = {}  # processor_config.json: the image-token counts (Gemma 3's image_seq_length, Idefics3's image_seq_len)
    if SPEC.arch in FAMILY_ARCHS and (ASSETS / "tiny_models" / SPEC.arch / "processor_config.json").is_file():
        settings = json.loads((ASSETS / "tiny_models" / SPEC.arch / "processor_config.json").read_text())
    try:
        return cls(parts.image_processor, parts.tokenizer, chat_template=parts.tokenizer.chat_template, **settings)
    except ImportError as err:  # e.g. SmolVLMProcessor.__init__ requires num2words, not installed here
        raise NoTRL(f"{name} cannot be built here: {' '.join(str(err).split())[:160]}") from err


def build_dataset(steps: int):
    """TRL's dataset: one row per (step, prompt), in the order mmrl draws them, with the target box for the reward."""
    from datasets import Dataset

    seeds = [s for step in world_seeds(steps) for s in step]
    env = sim.make("grounding", num_envs=len(seeds), image_size=IMAGE_SIZE)
    obs = env.reset(seed=seeds)
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": TEMPLATE.format(instruction=s)}] for s in obs.instruction],
            "image": [to_pil(img) for img in obs.image],
            "target_box": env.target_boxes.tolist(),
        }
    )


def timed(fn, log: list, keep=lambda args, kwargs: True):
    """`fn` that appends (start, seconds) of each call to `log` (instance-level instrumentation; no code patched)."""

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if keep(args, kwargs):
            log.append((start, time.perf_counter() - start))
        return out

    return wrapper


def per_step(step_s: list[float], gen: list[tuple[float, float]], lengths: list[float], warmup: int) -> list[dict]:
    """Samples of the steps after `warmup`. `period_s` is the time from this step's rollout start to the next one's:
    the whole loop per step, including what the step timers leave out (data loading, logging); None for the last."""
    if not (len(step_s) == len(gen) == len(lengths)):
        raise RuntimeError(
            f"step bookkeeping disagrees: {len(step_s)} steps, {len(gen)} rollouts, {len(lengths)} lengths"
        )
    starts = [g[0] for g in gen]
    out = []
    for i in range(warmup, len(step_s)):
        period = starts[i + 1] - starts[i] if i + 1 < len(starts) else None
        out.append({"step_s": step_s[i], "generate_s": gen[i][1], "period_s": period, "completion_len": lengths[i]})
    return out


# ----------------------------------------------------------------------------------------------- MMRL SIDE
def run_mmrl(run: Run, steps: int, warmup: int, workdir: Path, threads: int) -> list[dict]:
    """`mmrl.trainer.train` itself; the step time is its own `perf/step_s` (eval before the loop is not in it)."""
    reset_peak_memory()
    policy = make_policy(prompt_template=TEMPLATE)
    # mmrl's Sampling has no minimum length; the model's generation config carries one into `generate`.
    policy.model.generation_config.min_new_tokens = NEW_TOKENS
    gen: list[tuple[float, float]] = []
    # Only the training rollouts (group_size=G); the held-out eval before the loop generates with group_size=1.
    policy.generate = timed(
        policy.generate, gen, keep=lambda a, k: k.get("group_size", a[1] if len(a) > 1 else 1) == GROUP_SIZE
    )
    cfg = TrainConfig(
        model=ModelConfig(device=SPEC.device, dtype=SPEC.dtype, generation_backend=run.backend),
        env=EnvConfig(name="grounding", options={"image_size": IMAGE_SIZE}),
        sampling=SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1.0),
        algo=AlgoConfig(group_size=GROUP_SIZE, kl_coef=run.beta, clip_high=0.2),  # as TRL: clip 0.2 both sides
        trainer=TrainerConfig(
            total_steps=steps,
            prompts_per_step=PROMPTS,
            micro_batch_size=PROMPTS * GROUP_SIZE,  # one forward/backward, as TRL with per_device_train_batch_size=64
            lr=LR,
            eval_episodes=1,  # the smallest held-out eval (it runs before the loop, outside every timer)
            eval_batch_size=1,
            save_every=0,
            keep_checkpoints=1,
            threads=threads,
            seed=0,
        ),
        output_dir=str(workdir),
    )
    # stop_after: return right after the last step's checkpoint, skipping the final eval and plots (not timed anyway).
    with contextlib.redirect_stderr(io.StringIO()):  # the held-out line; errors still raise
        history = train(cfg, policy=policy, stop_after=steps)
    rows = [h for h in history if "perf/step_s" in h]
    samples = per_step([h["perf/step_s"] for h in rows], gen, [h["completion_len"] for h in rows], warmup)
    return [replace_peak(s) for s in samples]


# ----------------------------------------------------------------------------------------------- TRL SIDE
def run_trl(run: Run, steps: int, warmup: int, workdir: Path, dataset, model_dir: Path) -> list[dict]:
    """`GRPOTrainer.train`; the step time runs from `on_step_begin` to `on_step_end` of each optimiser step."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.begin, self.step_s, self.lengths = 0.0, [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self.begin)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                self.lengths.append(logs["completions/mean_length"])

    reset_peak_memory()
    model = make_policy().model  # the same weights as mmrl's policy
    model.config._name_or_path = str(model_dir)  # with beta > 0, TRL loads its reference model from this path
    args = GRPOConfig(
        output_dir=str(workdir),
        per_device_train_batch_size=PROMPTS * GROUP_SIZE,  # one optimiser step = B*G rows in one forward/backward
        gradient_accumulation_steps=1,
        num_generations=GROUP_SIZE,
        max_completion_length=NEW_TOKENS,
        generation_kwargs={"min_new_tokens": NEW_TOKENS},
        temperature=1.0,
        beta=run.beta,
        gradient_checkpointing=run.gradient_checkpointing,
        optim=run.optim,
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_steps=steps,
        shuffle_dataset=False,  # step s takes rows [s*B, (s+1)*B): the prompts mmrl draws at step s
        use_cpu=SPEC.device == "cpu",
        bf16=SPEC.dtype == "bfloat16",
        fp16=SPEC.dtype == "float16",
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    timer = StepTimer()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=grounding_reward,
        args=args,
        train_dataset=dataset.select(range(steps * PROMPTS)),
        processing_class=image_only_processor(),  # built once in main already: NoTRL is not raised here
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # with disable_tqdm it would print every step's logs
    gen: list[tuple[float, float]] = []
    trainer._generate = timed(trainer._generate, gen)  # prompt encoding + HF generate + decoding, like policy.generate
    trainer.train()
    return [replace_peak(s) for s in per_step(timer.step_s, gen, timer.lengths, warmup)]


def replace_peak(sample: dict) -> dict:
    """The sample with the run's peak GPU memory so far (`peak_gb`, None on the CPU)."""
    return {**sample, "peak_gb": peak_memory_gb()}


# ----------------------------------------------------------------------------------------------- CHECKS
def check_same_inputs(dataset, processor) -> int:
    """Fail unless both sides see the same prompt token ids and pixels and score completions the same. Returns P,
    mmrl's mean prompt length (the only thing done without TRL, `processor` None)."""
    from trl.data_utils import prepare_multimodal_messages

    policy = build_tiny(SPEC.arch, seed=0, prompt_template=TEMPLATE)  # encoding only: the processor is the same
    seeds = world_seeds(1)[0]
    env = sim.make("grounding", num_envs=PROMPTS, image_size=IMAGE_SIZE)
    obs = env.reset(seed=seeds)
    ours = policy.encode(obs)
    if processor is None:
        return int(ours["attention_mask"].sum(-1).float().mean())
    rows = [dataset[i] for i in range(PROMPTS)]
    convs = [prepare_multimodal_messages(r["prompt"], images=[r["image"]]) for r in rows]  # as GRPOTrainer does
    theirs = processor.apply_chat_template(convs, add_generation_prompt=True, tokenize=True, return_dict=True)
    for i in range(PROMPTS):
        mine = ours["input_ids"][i][ours["attention_mask"][i].bool()].tolist()
        if mine != list(theirs["input_ids"][i]):
            raise RuntimeError(f"prompt {i}: mmrl and TRL tokenise differently")
    # mmrl stacks every image's units (Qwen patch rows, Gemma images, Idefics3 tiles) along one dimension; a
    # processor batching per prompt (Idefics3's [B, tiles, 3, H, W]) holds the same units, tile counts equal here.
    pixels = torch.as_tensor(theirs["pixel_values"])
    if pixels.numel() != ours["pixel_values"].numel() or not torch.equal(
        pixels.reshape(ours["pixel_values"].shape), ours["pixel_values"]
    ):
        raise RuntimeError("mmrl and TRL preprocess the images differently")
    boxes = env.target_boxes
    texts = [f"<answer>[{', '.join(str(int(v) + k) for v in b)}]</answer>" for k, b in enumerate(boxes.tolist())]
    texts[1] = "no box here"
    want = env.step(texts).reward
    got = torch.tensor(grounding_reward([[{"content": t}] for t in texts], [r["target_box"] for r in rows]))
    torch.testing.assert_close(got, want)
    return int(ours["attention_mask"].sum(-1).float().mean())


def env_reset_seconds(repeats: int = 5) -> float:
    """What drawing a step's R = B*G worlds costs (inside mmrl's step time; TRL reads decoded rows instead)."""
    env = sim.make("grounding", num_envs=PROMPTS * GROUP_SIZE, image_size=IMAGE_SIZE)
    times = []
    for r in range(repeats):
        t0 = time.perf_counter()
        env.reset(seed=train_seeds(r, PROMPTS, GROUP_SIZE))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------------------------- REPORT
def machine() -> dict:
    import transformers
    import trl

    cpu = ""
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu,
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        "loadavg_start": list(os.getloadavg()),
    }


def describe(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {
        "n": len(values),
        "median": statistics.median(values),
        "q1": q[0],
        "q3": q[2],
        "min": min(values),
        "max": max(values),
    }


def summarise(run: Run) -> dict:
    col = lambda k: [s[k] for s in run.samples if s[k] is not None]  # noqa: E731
    rest = [s["step_s"] - s["generate_s"] for s in run.samples]
    return {
        "step_s": describe(col("step_s")),
        "generate_s": describe(col("generate_s")),
        "rest_s": describe(rest),
        "period_s": describe(col("period_s")),
        "completion_len": describe(col("completion_len")),
        "peak_gb": max(col("peak_gb"), default=None),  # the run's peak GPU memory (None on the CPU)
        "round_medians": run.round_medians,
    }


def ratio(trl: Run, mmrl: Run) -> dict:
    """TRL/mmrl from the pooled medians, and the spread of the per-round ratios (each round ran both, back to back)."""
    pooled = statistics.median(s["step_s"] for s in trl.samples) / statistics.median(s["step_s"] for s in mmrl.samples)
    rounds = [t / m for t, m in zip(trl.round_medians, mmrl.round_medians)]
    periods = (
        [s["period_s"] for s in trl.samples if s["period_s"]],
        [s["period_s"] for s in mmrl.samples if s["period_s"]],
    )
    period = statistics.median(periods[0]) / statistics.median(periods[1]) if all(periods) else None
    return {"step": pooled, "per_round": rounds, "period": period}


def main(argv: list[str] | None = None) -> None:
    global SPEC
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="rounds; each round runs every configuration once")
    parser.add_argument("--steps", type=int, default=3, help="timed optimiser steps per run")
    parser.add_argument("--warmup", type=int, default=1, help="steps per run before timing starts (dropped)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads on both sides")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma list of: matched (beta 0, no gradient checkpointing), kl (beta 0.04 on both sides), "
        "trl_defaults (TRL with its defaults: gradient checkpointing on, fused AdamW; against mmrl matched), "
        "hf_generate (mmrl matched with model.generation_backend=hf instead of its default lean loop)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write every sample and the summary here")
    parser.add_argument(
        "--model",
        default=SPEC.name,
        help=f"tiny:<{'|'.join(ALL_TINY_ARCHS)}> (default tiny:qwen2_vl), random:qwen2_5_vl_3b",
    )
    parser.add_argument("--device", default=SPEC.device, help="cpu (default) or cuda")
    parser.add_argument("--dtype", default=SPEC.dtype, choices=sorted(DTYPES), help="model dtype (default float32)")
    opts = parser.parse_args(argv)
    SPEC = ModelSpec(opts.model, opts.device, opts.dtype)
    variants = [v.strip() for v in opts.variants.split(",") if v.strip()]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from {', '.join(VARIANTS)}")

    torch.set_num_threads(opts.threads)
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    total = opts.warmup + opts.steps

    try:
        processor, no_trl = image_only_processor(), None
    except NoTRL as why:
        processor, no_trl = None, str(why)
    runs = [Run("mmrl", "mmrl"), Run("trl", "trl")]  # matched: always measured, the headline
    if "trl_defaults" in variants:
        runs.append(Run(TRL_DEFAULTS, "trl", gradient_checkpointing=True, optim="adamw_torch_fused"))
    if "hf_generate" in variants:
        runs.append(Run(MMRL_HF, "mmrl", backend="hf"))
    if "kl" in variants:
        runs += [Run(f"mmrl kl {KL_BETA}", "mmrl", beta=KL_BETA), Run(f"trl kl {KL_BETA}", "trl", beta=KL_BETA)]
    if no_trl is not None:
        runs = [run for run in runs if run.side == "mmrl"]

    info = machine()
    print(
        f"# GRPO optimiser step: mmrl vs TRL GRPOTrainer, {SPEC.name} on {SPEC.device} in {SPEC.dtype}, {info['date']}"
    )
    print(
        f"# {info['cpu']}, nproc {info['nproc']}, torch threads {info['torch_threads']}, python {info['python']}, "
        f"torch {info['torch']}, transformers {info['transformers']}, trl {info['trl']}, "
        f"load avg {' '.join(f'{x:.2f}' for x in info['loadavg_start'])}"
    )

    if no_trl is not None:
        print(f"# TRL cannot run {SPEC.name} here, so mmrl is timed alone: {no_trl}")
    dataset = build_dataset(total)
    prompt_len = check_same_inputs(dataset, processor)
    model = make_policy().model
    params = sum(p.numel() for p in model.parameters())
    print(
        f"# work per step: {PROMPTS} prompts x {GROUP_SIZE} completions x {NEW_TOKENS} new tokens (forced), "
        f"{IMAGE_SIZE} px images, {prompt_len}-token prompts ({'checked equal on both sides' if no_trl is None else 'mmrl alone'}), {params / 1e6:.2f} M params; "
        f"{opts.repeats} rounds x ({opts.warmup} warm-up + {opts.steps} timed steps) per configuration",
        flush=True,
    )

    with tempfile.TemporaryDirectory(prefix="mmrl-bench-") as tmp:
        tmp = Path(tmp)
        model_dir = tmp / "model"
        if "kl" in variants:  # TRL builds its reference model from this folder
            model.save_pretrained(model_dir)
        del model
        for r in range(opts.repeats):
            order = runs[r % len(runs) :] + runs[: r % len(runs)]  # rotate, so no run always follows the same one
            for k, run in enumerate(order):
                workdir = tmp / f"r{r}_{k}"
                held = release_memory()  # GB allocated before this run starts, counted in its peak
                t0 = time.perf_counter()
                if run.side == "mmrl":
                    samples = run_mmrl(run, total, opts.warmup, workdir, opts.threads)
                else:
                    samples = run_trl(run, total, opts.warmup, workdir, dataset, model_dir)
                run.samples += samples
                run.round_medians.append(statistics.median(s["step_s"] for s in samples))
                print(
                    f"round {r + 1}/{opts.repeats}  {run.name:<36} step_s "
                    + " ".join(f"{s['step_s']:.3f}" for s in samples)
                    + f"  ({time.perf_counter() - t0:.0f} s with setup"
                    + (f", {held:.1f} GB held before it)" if held is not None else ")"),
                    flush=True,
                )

    summary = {run.name: summarise(run) for run in runs}
    by_name = {run.name: run for run in runs}
    ratios = {"matched": ratio(by_name["trl"], by_name["mmrl"])} if no_trl is None else {}
    if "trl_defaults" in variants and no_trl is None:
        ratios["trl_defaults"] = ratio(by_name[TRL_DEFAULTS], by_name["mmrl"])
    if "hf_generate" in variants and no_trl is None:
        ratios["hf_generate"] = ratio(by_name["trl"], by_name[MMRL_HF])
    if "kl" in variants and no_trl is None:
        ratios["kl"] = ratio(by_name[f"trl kl {KL_BETA}"], by_name[f"mmrl kl {KL_BETA}"])
    info["loadavg_end"] = list(os.getloadavg())

    print()
    print(
        "median seconds per optimiser step; [q1-q3] over all timed steps; generate = prompt encoding + sampling + decoding;"
    )
    print(
        "rest = step - generate (scoring, advantages, forward/backward, clipping, AdamW); period = rollout start to next"
    )
    header = f"{'run':<36} {'n':>3} {'step':>7} {'[q1-q3]':>15} {'generate':>9} {'rest':>7} {'period':>7} {'len':>5}"
    print(header)
    print("-" * len(header))
    for run in runs:
        s = summary[run.name]
        st = s["step_s"]
        period = s["period_s"].get("median")
        spread = f"[{st['q1']:.3f}-{st['q3']:.3f}]"
        print(
            f"{run.name:<36} {st['n']:>3} {st['median']:>7.3f} {spread:>15} "
            f"{s['generate_s']['median']:>9.3f} {s['rest_s']['median']:>7.3f} "
            f"{(f'{period:.3f}' if period else '-'):>7} {s['completion_len']['median']:>5.1f}"
            + (f"  peak {s['peak_gb']:.1f} GB" if s["peak_gb"] is not None else "")
        )
    print()
    if no_trl is not None:
        print(f"TRL/mmrl: not measured, TRL cannot run {SPEC.name} here: {no_trl}")
    for name, rt in ratios.items():
        rounds = rt["per_round"]
        period = f", loop period {rt['period']:.2f}x" if rt["period"] else ""
        print(
            f"TRL/mmrl {name:<13} {rt['step']:.2f}x step time (per-round ratios {min(rounds):.2f}-{max(rounds):.2f}){period}"
        )
    print(
        f"# mmrl's step includes drawing its {PROMPTS * GROUP_SIZE} worlds (env.reset, {1e3 * env_reset_seconds():.0f} ms "
        f"here); TRL's step excludes its dataloader (in 'period'). load avg at end "
        f"{' '.join(f'{x:.2f}' for x in info['loadavg_end'])}"
    )

    if opts.json is not None:
        payload = {
            "machine": info,
            "work": {
                "model": SPEC.name,
                "device": SPEC.device,
                "dtype": SPEC.dtype,
                "params": params,
                "prompts": PROMPTS,
                "group_size": GROUP_SIZE,
                "new_tokens": NEW_TOKENS,
                "image_size": IMAGE_SIZE,
                "prompt_tokens": prompt_len,
                "template": TEMPLATE,
            },
            "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()},
            "runs": [
                {**{k: v for k, v in vars(run).items() if k != "samples"}, "samples": run.samples} for run in runs
            ],
            "summary": summary,
            "ratios": ratios,
            "no_trl": no_trl,
        }
        opts.json.parent.mkdir(parents=True, exist_ok=True)
        opts.json.write_text(json.dumps(payload, indent=2))
        print(f"# wrote {opts.json}")


if __name__ == "__main__":
    main()
