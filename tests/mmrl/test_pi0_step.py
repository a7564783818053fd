"""bench/pi0_step.py: the real-size π0 it builds is π0's published size, and at the tiny size on the CPU it runs an
update step and samples chunks, printing the figures."""

import importlib.util
import re
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pi0_step.py"


def _bench():
    spec = importlib.util.spec_from_file_location("pi0_step_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_real_size_is_pi0s_published_size():
    from transformers import PI0ForConditionalGeneration

    bench = _bench()
    config = bench.real_config(image_token_id=512)
    assert (config.chunk_size, config.num_inference_steps, config.max_state_dim, config.max_action_dim) == (
        50,
        10,
        32,
        32,
    )
    with torch.device("meta"):  # the parameters' shapes only, no memory
        model = PI0ForConditionalGeneration(config)
    count = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    dit = model.model.dit
    # openpi: SigLIP so400m (~400 M), Gemma 2B (2.5 G with its 257,152-row embedding), a 311 M action expert.
    assert 400e6 < count(model.model.vlm.vision_tower) < 420e6
    assert 2.45e9 < count(model.model.vlm.language_model) < 2.55e9
    assert 305e6 < count(dit) - dit.embed_tokens.weight.numel() < 315e6
    assert model.model.vlm.config.image_token_id == 512


def test_tiny_run_prints_the_update_step_and_the_sampling_latency(capsys):
    results = _bench().main(
        ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--repeats", "1", "--rows", "4", "--group", "2",
         "--batches", "1,2"]
    )  # fmt: skip
    out = capsys.readouterr().out
    step = re.search(r"update step \(4 rows x K=4, PPO-clip \+ AdamW\): ([\d.]+) s", out)
    assert step and float(step.group(1)) > 0, out
    for batch in (1, 2):
        line = re.search(rf"sample one chunk, batch {batch}: ([\d.]+) ms", out)
        assert line and float(line.group(1)) > 0, out
    update = results["update"]
    assert update["step_s"] >= update["forward_s"] > 0 and update["backward_s"] > 0
    assert update["peak_gb"] is None  # CPU: no CUDA memory to report
    assert set(results["sample"]) == {1, 2}


def test_tiny_run_with_gradient_checkpointing(capsys):
    results = _bench().main(
        ["--size", "tiny", "--device", "cpu", "--dtype", "float32", "--repeats", "1", "--rows", "2", "--group", "2",
         "--batches", "1", "--checkpointing"]
    )  # fmt: skip
    assert results["update"]["step_s"] > 0 and "update step (2 rows x K=4" in capsys.readouterr().out
