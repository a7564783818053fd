"""`mmrl`: train, evaluate, score and list environments from the command line."""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # before anything imports the tokenizers library

import argparse  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# Nothing of the project (nor torch, transformers, the simulators) is imported here: each command imports what it
# needs when it runs, so `mmrl --help` and a mistyped command answer at once instead of after seconds of imports.
# tests/test_imports.py exempts this module, and only this one, from its rule against function-local imports;
# tests/mmrl/test_cli.py checks that importing it leaves torch, transformers, numpy and sim unimported.

EPILOG = """examples:
  mmrl train configs/grounding_tiny.yaml
  mmrl train configs/grounding_tiny.yaml trainer.total_steps=50 output_dir=runs/short
  mmrl train configs/grounding_tiny.yaml output_dir=runs/short resume=true
  torchrun --nproc_per_node=2 -m mmrl train configs/grounding_tiny.yaml model.device=cuda
  mmrl eval configs/grounding_tiny.yaml checkpoint=runs/short/checkpoints/step_00000050
  mmrl eval configs/grounding_tiny.yaml checkpoint=runs/short/checkpoints/step_00000050 eval.k=8
  mmrl eval configs/grounding_tiny.yaml checkpoint=runs/short/checkpoints/step_00000050 --split validation
  mmrl envs
  mmrl data check data/refcoco.jsonl --model Qwen/Qwen2.5-VL-3B-Instruct image_size=448
  mmrl export runs/short exported/short
  mmrl score pairs.jsonl --metrics ssim,pixel,edge --render svg --size 256 --out scores.csv
"""


def main(argv: list[str] | None = None) -> int:
    """Run one `mmrl` command; a user's mistake is one line on stderr and exit code 2, a bug keeps its traceback
    (set `MMRL_TRACEBACK=1` to see the traceback of a mistake too).

    The mistakes are the project's two exception types for them, whichever command and however deep they are raised:
    `sim.errors.InputError` (a dataset record, an env option, a checkpoint or model folder; the message names the
    file, line and field) and `mmrl.runtime.config.ConfigError` (a config key or value; the message names the key).
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    if args.command == "data":  # `key=value` overrides may follow its options too, as `mmrl train`'s follow the preset
        args.overrides += [word for word in extra if "=" in word and not word.startswith("-")]
        extra = [word for word in extra if word not in args.overrides]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return run_command(args)
    except KeyboardInterrupt:  # Ctrl-C in a command other than train (which says where its run stands)
        print("mmrl: stopped (Ctrl-C)", file=sys.stderr)
        return 130
    except Exception as error:
        kind = user_error(error)
        if kind is None or os.environ.get("MMRL_TRACEBACK"):  # a bug, or asked for: the traceback
            raise
        message = " ".join(str(error.args[0] if error.args else error).split("\n"))
        print(f"mmrl: {kind}{message}", file=sys.stderr)
        return 2


def user_error(error: BaseException) -> str | None:
    """The prefix to print `error` with if it is a user's mistake ("" or "config error: "), else None (a bug).

    The types are looked up among the imported modules: an error of a type whose module was never imported cannot
    have been raised, and importing them here would load torch for `mmrl --help`.
    """
    config = getattr(sys.modules.get("mmrl.runtime.schema"), "ConfigError", None)
    if config is not None and isinstance(error, config):
        return "config error: "
    inputs = getattr(sys.modules.get("sim.errors"), "InputError", None)
    if inputs is not None and isinstance(error, inputs):
        return ""
    return None


def run_command(args: argparse.Namespace) -> int:
    """The command `args` names, parsed; errors propagate to `main`."""
    if args.command == "score":
        from rewards.score import run as run_score

        return run_score(args)
    if args.command == "export":
        from .export import export
        from .runtime.checkpoint import MANIFEST, checkpoint_problem

        if (Path(args.source) / MANIFEST).is_file():  # a training checkpoint folder: it says what it must hold
            problem = checkpoint_problem(args.source)
            if problem is not None:
                print(f"mmrl export: checkpoint {args.source} is damaged: {problem}", file=sys.stderr)
                return 2
        out = export(args.source, args.out, args.dtype)  # a wrong source or out is an InputError naming it
        print(f"exported to {out}")
        return 0

    if args.command == "data":
        from .data_check import run as run_data_check

        return run_data_check(args)
    if args.command == "envs":
        import sim
        from sim.registry import env_defaults

        width = max(len(name) for name in sim.ENVS.names())
        print(f"{'name':{width}s} {'actions':10s} {'image':9s} {'steps':6s}  description")
        for name in sim.ENVS.names():
            cls = sim.ENVS.get(name)
            # Read from the class, not a built env: building one may start a simulator or worker processes.
            listed = env_defaults(cls)
            size = listed.image_size
            image = f"{size}x{size}" if isinstance(size, int) else size or "-"  # a word: the option it depends on
            kind = listed.action_kind or "-"
            steps = "-" if listed.max_episode_steps is None else str(listed.max_episode_steps)
            summary = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
            print(f"{name:{width}s} {kind:10s} {image:9s} {steps:6s}  {summary}")
        return 0
    from .runtime.config import check_at_load, load_config
    from .runtime.folders import check_model_folders

    try:
        cfg = load_config(args.config, args.overrides)
    except (OSError, UnicodeDecodeError) as e:  # no such file, a folder, unreadable, not UTF-8
        print(f"mmrl: config error: {args.config}: {e}", file=sys.stderr)
        return 2
    from .policy import check_run, tiny_names

    check_model_folders(cfg, args.command, tiny_names())  # the tiny models the registered policy kinds build
    check_at_load(cfg)
    if args.command == "train":
        from .runtime.distributed import close_world
        from .trainer import train

        try:
            train(cfg)  # under torchrun, one of K processes (see mmrl.runtime.distributed)
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: where the run stands, how to continue it
            print(f"mmrl: {stopped(args, cfg.output_dir, stop)}", file=sys.stderr)
            return 143 if stop.args and stop.args[0] == "SIGTERM" else 130
        finally:
            close_world()
        if os.environ.get("RANK", "0") == "0":  # under torchrun, once
            print(where_it_went(cfg))
    else:
        from .policy import load_policy
        from .report import metric_label, write_eval_report, write_sampled_report
        from .runtime.checkpoint import MANIFEST, checkpoint_problem
        from .stages.evaluate import evaluate_k, held_out

        if cfg.checkpoint is None:
            print("mmrl eval: give the checkpoint to evaluate as checkpoint=PATH", file=sys.stderr)
            return 2
        if not Path(cfg.checkpoint).is_dir():
            print(f"mmrl eval: no checkpoint folder at {cfg.checkpoint}", file=sys.stderr)
            return 2
        if (Path(cfg.checkpoint) / MANIFEST).is_file():  # a training checkpoint: it says what it must hold
            problem = checkpoint_problem(cfg.checkpoint)
            if problem is not None:
                print(f"mmrl eval: checkpoint {cfg.checkpoint} is damaged: {problem}", file=sys.stderr)
                return 2
        check_run(cfg)  # what the options ask of the checkpoint's kind, before it loads
        # The training run's model options too (pixel range, history), so the checkpoint sees what it trained on.
        policy = load_policy(cfg.model, checkpoint=cfg.checkpoint).apply_options(cfg.model)
        result = held_out(policy, cfg, split=args.split)
        # Next to the checkpoint it scores, so that evaluating several checkpoints of a run overwrites nothing.
        checkpoint = Path(cfg.checkpoint)
        suffix = ".eval" if args.split == "test" else f".eval-{args.split}"
        report_dir = checkpoint.parent / f"{checkpoint.name}{suffix}"
        label = metric_label(cfg)
        for key, value in sorted(result.metrics.items()):
            print(f"{key:16s} {value:.4f}")
        split = "held-out" if args.split == "test" else args.split  # the test split's line as training prints it
        print(f"{split} {label}: {result.metrics[cfg.env.eval_metric]:.3f}")
        if result.protocol:
            print(f"protocol: {result.protocol}")
        print(f"table and videos: {write_eval_report(cfg, result, report_dir)}")
        if cfg.eval.k > 0:  # k sampled answers per item: avg@k, pass@k, and a report
            sampled = evaluate_k(policy, cfg, split=args.split)
            for key, value in sampled.summary().items():
                print(f"{key:16s} {value:.4f}")
            for task, row in sampled.by_task().items():
                print(f"{task}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "items")
                      + f" ({int(row['items'])} items)")  # fmt: skip
            if sampled.correct is None:
                print(f"(no pass@k: the {cfg.env.name} env reports no success per episode)")
            path = write_sampled_report(cfg, result.metrics, sampled, report_dir)
            print(f"report: {path}")
    return 0


def stopped(args: argparse.Namespace, output_dir: str, stop: KeyboardInterrupt) -> str:
    """The one line a stopped `mmrl train` ends with: the last checkpoint and the command that continues from it."""
    import shlex

    from .runtime.checkpoint import latest_checkpoint

    how = stop.args[0] if stop.args else "Ctrl-C"
    try:
        last = latest_checkpoint(output_dir)
    except ValueError:  # checkpoints, none complete
        last = None
    if last is None:
        return f"stopped ({how}) before a checkpoint was written in {output_dir}: nothing to resume"
    kept = [o for o in args.overrides if o.split("=", 1)[0] not in ("resume", "overwrite")]
    again = shlex.join(["mmrl", "train", args.config, *kept, "resume=true"])
    return f"stopped ({how}); the last checkpoint is {last}; continue with: {again}"


def where_it_went(cfg) -> str:
    """What a finished `mmrl train` wrote, and where: the run folder, its last checkpoint, metrics, TensorBoard
    events, report."""
    from .runtime.checkpoint import latest_checkpoint

    out = Path(cfg.output_dir)
    lines = [f"run folder:      {out}", f"last checkpoint: {latest_checkpoint(out)}", f"metrics:         "
             f"{out / 'metrics.jsonl'}"]  # fmt: skip
    if (out / "tensorboard").is_dir():
        lines.append(f"tensorboard:     {out / 'tensorboard'} (tensorboard --logdir {out / 'tensorboard'})")
    if (out / "eval.json").is_file():
        pictures = ", ".join(p.name for p in sorted(out.glob("*.png")))
        lines.append(f"report:          {out / 'eval.json'}" + (f" ({pictures})" if pictures else ""))
    return "\n".join(lines)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The `mmrl` argument parser; the `score` command's arguments only when `argv` runs that command.

    The `score` arguments are defined by `rewards.score`, whose import pulls in torch (`rewards` needs it); the other
    commands' help and parsing should not wait for that.
    """
    parser = argparse.ArgumentParser(
        prog="mmrl", description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("train", "train a policy with GRPO"), ("eval", "evaluate a checkpoint on held-out seeds")):
        p = sub.add_parser(name, help=help_, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("config", help="a YAML preset from configs/")
        p.add_argument("overrides", nargs="*", help="section.field=value overrides, e.g. trainer.lr=1e-5")
        if name == "eval":  # the names of sim.seeds.SPLITS (sim is not imported before a command runs)
            p.add_argument("--split", choices=("test", "validation"), default="test",
                           help="the held-out seeds to play: test (the reported score) or validation (for tuning "
                           "and choosing checkpoints)")  # fmt: skip
    sub.add_parser("envs", help="list the registered environments")
    data = sub.add_parser("data", help="look at a dataset before training on it")
    checker = data.add_subparsers(dest="data_command", required=True).add_parser(
        "check",
        help="read a dataset as training would: rows, targets, image sizes, box units, prompt tokens, bad rows",
        description="Read a dataset with the dataset env's options as a run would, show every record once, and "
        "report rows, target kinds, image sizes, the boxes' convention, prompt tokens per row (with --model) and "
        "every bad row with its reason. Exit code 2 when a row is bad.",
    )
    checker.add_argument("path", help="the dataset: a JSON-lines file or a folder, as env.options.path takes it")
    checker.add_argument(
        "overrides", nargs="*", help="key=value env options (image_size=128) or section.field=value config fields"
    )
    checker.add_argument("--model", help="model.path: its coordinate convention, and prompt tokens per row")
    checker.add_argument("--config", help="a YAML preset on the dataset env whose options the data is read with")
    exporter = sub.add_parser(
        "export",
        help="write a run's policy as a standalone Hugging Face model folder (LoRA merged)",
        description="Write a run's (latest) or a checkpoint's policy as a folder that AutoModelForImageTextToText "
        "and the tokenizer and image processor load, LoRA adapters merged, training state left behind.",
    )
    exporter.add_argument("source", help="a run's output folder (its latest checkpoint) or a checkpoint folder")
    exporter.add_argument("out", help="the folder to write (must not exist or be empty)")
    exporter.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))

    score = sub.add_parser(
        "score",
        help="score predictions (images, SVG, chart code, text) against targets",
        description="Score predictions against targets with the reward library; see `rewards.score` for the inputs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # The top-level parser takes no option but -h, so the first word that is not an option is the command.
    if next((word for word in argv if not word.startswith("-")), None) == "score":
        from rewards.score import EXAMPLES, add_arguments

        score.epilog = EXAMPLES
        add_arguments(score)
    return parser


if __name__ == "__main__":
    sys.exit(main())
