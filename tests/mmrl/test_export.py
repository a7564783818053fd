"""`mmrl export`: a run's policy as a standalone Hugging Face folder, LoRA merged; loaded back with plain transformers."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from mmrl.cli import main
from mmrl.export import export
from mmrl.policy import Sampling, VLMPolicy
from mmrl.policy.vlm.processing import VisionTextProcessor
from mmrl.trainer import train

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_run_config):
    """A one-step LoRA run of the tiny preset (adapters saved beside unmerged base weights). The random model's
    rewards are all alike, so the entropy bonus is what moves the adapters."""
    out = tmp_path_factory.mktemp("lora_run")
    overrides = ("trainer.total_steps=1", "model.lora.r=4", "model.lora.alpha=8", "algo.entropy_coef=0.1")
    train(tiny_run_config(out, *overrides, "trainer.lr=1e-2"))
    return out


def test_export_merges_lora_into_a_folder_plain_transformers_loads(lora_run, tmp_path, grounding_obs, capsys):
    out = tmp_path / "exported"
    assert main(["export", str(lora_run), str(out)]) == 0
    assert "exported to" in capsys.readouterr().out
    assert not (out / "lora").exists() and not (out / "training_state.pt").exists()
    assert json.loads((out / "mmrl_export.json").read_text())["lora_merged"] is True
    # Plain transformers: no PEFT, no mmrl. The tokenizer carries the chat template.
    model = AutoModelForImageTextToText.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    AutoImageProcessor.from_pretrained(out)
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )
    if importlib.util.find_spec("torchvision") is not None:  # AutoProcessor builds a video processor: torchvision
        from transformers import AutoProcessor

        AutoProcessor.from_pretrained(out)
    # The merged model scores a rollout as the trained (adapted) policy does, and generates.
    trained = VLMPolicy.from_pretrained(lora_run / "checkpoints" / "step_00000001", prompt_template="{instruction}")
    exported = VLMPolicy(model, VisionTextProcessor.from_pretrained(out), prompt_template="{instruction}")
    torch.manual_seed(0)
    rollout = exported.generate(grounding_obs("qwen2_vl", [0, 0]), 2, Sampling(max_new_tokens=6))
    mask = rollout.completion_mask
    want = trained.logprobs(rollout).detach()
    torch.testing.assert_close(exported.logprobs(rollout).detach()[mask], want[mask], rtol=0, atol=1e-5)
    torch.testing.assert_close(rollout.logprobs[mask], want[mask], rtol=0, atol=1e-4)
    # ... which the base weights alone (the checkpoint read without its adapters) do not: the merge mattered.
    base = AutoModelForImageTextToText.from_pretrained(lora_run / "checkpoints" / "step_00000001")
    unadapted = VLMPolicy(base, exported.processor, prompt_template="{instruction}").logprobs(rollout).detach()
    assert (unadapted[mask] - want[mask]).abs().max() > 1e-4


def test_export_refuses_what_it_cannot_do(lora_run, tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert main(["export", str(lora_run), str(tmp_path / "full")]) == 2
    assert "not empty" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing"), str(tmp_path / "out")]) == 2
    assert "neither a checkpoint folder nor a run folder" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown dtype"):
        export(lora_run, tmp_path / "out2", dtype="int8")


def test_export_in_bfloat16_from_a_checkpoint_folder(lora_run, tmp_path):
    out = export(lora_run / "checkpoints" / "step_00000001", tmp_path / "bf16", dtype="bfloat16")
    model = AutoModelForImageTextToText.from_pretrained(out, dtype="auto")
    assert model.dtype == torch.bfloat16
