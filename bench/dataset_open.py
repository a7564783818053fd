"""How long the `dataset` env takes to open a large dataset, and in how much memory: parquet against `save_to_disk`.

Writes a hub-style repository of `--rows` rows (`data/train-0000k-of-00002.parquet`, row groups of 1000 rows as the
hub writes image sets in small groups; each row a small synthetic PNG in the Image feature's `{bytes, path}` struct,
a question and a `[x, y, w, h]` box, as RefCOCO stores them), and the same rows as a `Dataset.save_to_disk` folder,
to a temporary folder. Each is then opened in a fresh process (`make("dataset", ...)` with `box_format="xywh"`):
reported are the seconds to open (every row validated; wall clock and this process's CPU time, which a shared
machine's load does not inflate), the seconds of the first `reset` (8 worlds, their images decoded), and the
process's peak resident memory, beside its resident memory after the imports alone. With `--baseline DIR` (a checkout
of other code, e.g. `git archive <commit> | tar -x -C DIR`), each dataset is also opened by that code, in the same run, and
the open CPU seconds' ratio is printed.

    .venv/bin/python bench/dataset_open.py [--rows 200000] [--keep DIR] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # before bench/, whose rewards.py would hide the `rewards` package
SIDE = 48  # pixels of each synthetic image's side
GROUP = 1000  # rows per parquet row group


def pngs(count: int) -> list[tuple[bytes, list[int]]]:
    """`count` distinct small PNGs, each with the [x, y, w, h] box of its one dark square."""
    from PIL import Image

    images = []
    for index in range(count):
        x, y, w = index % 30, (index // 30) % 30, 8 + index % 10
        image = Image.new("RGB", (SIDE, SIDE), (220, 220, 220))
        image.paste((30, 90, 160), (x, y, x + w, y + w))
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        images.append((buffer.getvalue(), [x, y, w, w]))
    return images


def write(folder: Path, rows: int) -> tuple[Path, Path]:
    """The hub-style parquet repository and the `save_to_disk` folder of the same `rows` rows."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    pool = pngs(1000)
    picks = [pool[i % len(pool)] for i in range(rows)]
    table = pa.table(
        {
            "image": pa.array(
                [{"bytes": data, "path": f"{i}.png"} for i, (data, _) in enumerate(picks)],
                pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
            ),
            "question": [f"Find the blue square number {i}." for i in range(rows)],
            "bbox": [box for _, box in picks],
        }
    )
    repo = folder / "repo"
    (repo / "data").mkdir(parents=True)
    half = rows // 2
    for shard, part in enumerate((table.slice(0, half), table.slice(half))):
        pq.write_table(part, repo / "data" / f"train-{shard:05d}-of-00002.parquet", row_group_size=GROUP)
    saved = folder / "saved"
    datasets.Dataset(table).cast_column("image", datasets.Image()).save_to_disk(str(saved))
    return repo, saved


def child(path: str, code: str | None) -> None:
    """Open the dataset at `path` in this process (with the repository at `code`, or this one) and print the figures
    as JSON."""
    if code:
        sys.path.insert(0, code)
    import sim.tasks.dataset  # noqa: F401  (registers `dataset`)
    from sim import make

    imported = rss_mib()
    start, cpu = time.perf_counter(), time.process_time()
    env = make("dataset", num_envs=8, path=path, box_format="xywh", image_size=64)
    opened, opened_cpu = time.perf_counter() - start, time.process_time() - cpu
    start = time.perf_counter()
    env.reset(seed=list(range(8)))
    first = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"records": len(env.records), "open_s": opened, "open_cpu_s": opened_cpu, "first_reset_s": first, "imports_mib": imported,
                      "peak_mib": peak}))  # fmt: skip


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def size_mib(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--keep", type=Path, help="write the data here and keep it (default: a temporary folder)")
    parser.add_argument("--baseline", type=Path, help="a checkout of other code to open each dataset with as well")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--code", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.code)
        return
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        start = time.perf_counter()
        repo, saved = write(folder, args.rows)
        print(f"{args.rows} rows written in {time.perf_counter() - start:.1f} s "
              f"({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs)")  # fmt: skip
        print("| data | code | on disk (MiB) | open (s) | open, CPU (s) | first reset, 8 worlds (s) | RSS after imports "
              "(MiB) | peak RSS (MiB) |")  # fmt: skip
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        codes = [("this", REPO)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
        for name, path in (("parquet repository (2 shards)", repo), ("save_to_disk folder", saved)):
            cpu = {}
            for label, code in codes:
                env = {**os.environ, "PYTHONPATH": str(code)}
                out = subprocess.run([sys.executable, __file__, "--child", str(path), "--code", str(code)], env=env,
                                     capture_output=True, text=True, check=True).stdout  # fmt: skip
                figures = json.loads(out.strip().splitlines()[-1])
                assert figures["records"] == args.rows, figures
                cpu[label] = figures["open_cpu_s"]
                print(f"| {name} | {label} | {size_mib(path):.0f} | {figures['open_s']:.2f} | {figures['open_cpu_s']:.2f} | "
                      f"{figures['first_reset_s']:.3f} | {figures['imports_mib']:.0f} | {figures['peak_mib']:.0f} |")  # fmt: skip
            if len(cpu) == 2:
                print(f"{name}: open CPU seconds, baseline / this = {cpu['baseline'] / cpu['this']:.2f}")


if __name__ == "__main__":
    main()
