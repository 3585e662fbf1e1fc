"""LoRA runner: checkpoints every N steps, the last K kept, written whole; resuming from one
continues the run exactly; the merged model and the closing sample."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from gpustation.runners import lora
from gpustation.runners.lib import checkpoint, llm
from gpustation.runs.checkpoints import MARKER, latest_checkpoint
from tests.runners.conftest import RunInprocess
from tests.runners.test_lora import TINY

SMALL = ("--seq-len", "32", "--batch-size", "4", "--lr", "0.01", "--lr-warmup-steps", "0")
WEIGHTS = checkpoint.ADAPTER_WEIGHTS


def _tensors(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float) -> None:
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(a[key], b[key], **tol)  # type: ignore[arg-type]


def test_checkpoints_every_n_keep_the_last_k_each_complete(
    run_inprocess: RunInprocess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = run_inprocess(
        "lora", *TINY, *SMALL, "--steps", "6", "--checkpoint-every", "2",
        "--keep-checkpoints", "2", "--generate-tokens", "0", "--output-dir", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    root = out / "checkpoints"
    # Written at steps 2, 4 and 6; the oldest was deleted, no temporary folder is left.
    assert "checkpoint at step 2" in r.stdout and "checkpoint at step 6" in r.stdout
    assert sorted(p.name for p in root.iterdir()) == ["step-00000004", "step-00000006"]
    for step in (4, 6):
        ckpt = root / f"step-{step:08d}"
        marker = json.loads((ckpt / MARKER).read_text())
        assert marker["step"] == step and marker["total_steps"] == 6
        assert marker["data_position"]["batches"] == step
        assert (ckpt / checkpoint.STATE_FILE).stat().st_size > 0
        state = torch.load(ckpt / checkpoint.STATE_FILE, weights_only=True)
        assert state["schedule"]["last_epoch"] == step
        adapter = ckpt / checkpoint.ADAPTER_DIR
        assert llm.read_base_info(adapter)["model_preset"] == "tiny"
        assert (adapter / "adapter_config.json").exists()
    # The last checkpoint holds the adapter the run ended with; the one before differs.
    last = _tensors(root / "step-00000006" / "adapter" / WEIGHTS)
    _assert_same(last, _tensors(out / "adapter" / WEIGHTS), rtol=0, atol=0)
    earlier = _tensors(root / "step-00000004" / "adapter" / WEIGHTS)
    assert any(not torch.equal(last[k], earlier[k]) for k in last)
    assert r.summary["last_checkpoint"] == str(root / "step-00000006")

    # A folder that never got its marker (a crash mid-write), one whose marker is
    # cut short and a writer's temporary folder are not checkpoints.
    shutil.copytree(root / "step-00000006", root / "step-00000008")
    (root / "step-00000008" / MARKER).unlink()
    shutil.copytree(root / "step-00000006", root / "step-00000010")
    (root / "step-00000010" / MARKER).write_text('{"step": 1')
    shutil.copytree(root / "step-00000006", root / ".step-00000012.999.tmp")
    found = latest_checkpoint(out)
    assert found is not None and found.step == 6 and found.path == root / "step-00000006"
    assert checkpoint.find(out).step == 6

    # 0 keeps none at all.
    none = tmp_path / "none"
    r = run_inprocess(
        "lora", *TINY, *SMALL, "--steps", "2", "--keep-checkpoints", "0",
        "--generate-tokens", "0", "--no-verify-adapter", "--output-dir", str(none),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert not (none / "checkpoints").exists() and latest_checkpoint(none) is None


def test_resume_continues_the_run_exactly(run_inprocess: RunInprocess, tmp_path: Path) -> None:
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    common = (*TINY, *SMALL, "--steps", "6", "--log-every", "1", "--generate-tokens", "0")
    a = run_inprocess("lora", *common, "--checkpoint-every", "3", "--output-dir", str(full))
    assert a.returncode == 0, a.stderr
    ckpt = full / "checkpoints" / "step-00000003"

    b = run_inprocess(
        "lora", *common, "--resume-from", str(ckpt), "--output-dir", str(resumed)
    )  # fmt: skip
    assert b.returncode == 0, b.stderr
    assert f"resumed from {ckpt} at step 3" in b.stdout
    steps = [e["step"] for e in b.steps if "loss" in e]
    assert steps == [4, 5, 6]
    # Adapter, optimizer moments, LR schedule, RNG and data order all came back:
    # the resumed steps give the losses and the adapter of the uninterrupted run.
    full_losses = {e["step"]: e["loss"] for e in a.steps if "loss" in e}
    for e in b.steps:
        if "loss" in e:
            assert e["loss"] == pytest.approx(full_losses[e["step"]], rel=1e-5), e["step"]
            assert e["lr"] == pytest.approx(
                next(f["lr"] for f in a.steps if f.get("step") == e["step"] and "lr" in f)
            )
    _assert_same(
        _tensors(resumed / "adapter" / WEIGHTS),
        _tensors(full / "adapter" / WEIGHTS),
        rtol=1e-5,
        atol=1e-6,
    )
    s = b.summary
    assert s["resumed_from"]["step"] == 3 and s["resumed_from"]["checkpoint"] == str(ckpt)
    assert s["first_loss"] == pytest.approx(full_losses[4], rel=1e-5)

    # The weights a resume loads are those the checkpoint saved (not a fresh adapter).
    from peft import get_peft_model_state_dict

    args = lora.build_parser().parse_args([*TINY, *SMALL, "--steps", "6"])
    model, loaded = lora.prepare_model(args, torch.device("cpu"))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr)
    trainer = checkpoint.Trainer(
        model,
        loaded.info,
        optimizer,
        torch.optim.lr_scheduler.LambdaLR(optimizer, lora.lr_lambda(args)),
        torch.amp.GradScaler("cpu", enabled=False),
    )
    saved = _tensors(ckpt / "adapter" / WEIGHTS)
    fresh = {k: v.clone() for k, v in get_peft_model_state_dict(model).items()}
    assert any(not torch.equal(fresh[k], saved[k]) for k in saved)
    checkpoint.load(checkpoint.find(ckpt), trainer, torch.device("cpu"))
    _assert_same(dict(get_peft_model_state_dict(model)), saved, rtol=0, atol=0)
    assert trainer.schedule.last_epoch == 3
    assert all(int(st["step"]) == 3 for st in optimizer.state.values())


def test_resume_refuses_a_checkpoint_that_does_not_fit(
    run_inprocess: RunInprocess, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    common = (*TINY, *SMALL, "--generate-tokens", "0", "--no-verify-adapter")
    r = run_inprocess("lora", *common, "--steps", "2", "--output-dir", str(out))
    assert r.returncode == 0, r.stderr
    other = ("--output-dir", str(tmp_path / "other"), "--resume-from", str(out))
    r = run_inprocess("lora", *common, "--steps", "4", "--lora-r", "8", *other)
    assert r.returncode == 2 and "r=16" in r.stderr and "--lora-r" in r.stderr
    r = run_inprocess("lora", *common, "--steps", "4", "--seed", "1", *other)
    assert r.returncode == 2 and "seed 0" in r.stderr and "seed 1" in r.stderr
    r = run_inprocess("lora", *common, "--steps", "2", *other)
    assert r.returncode == 2 and "at step 2" in r.stderr and "--steps 4" in r.stderr
    r = run_inprocess("lora", *common, "--steps", "4", "--resume-from", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no complete checkpoint" in r.stderr
    # a damaged checkpoint: its training state, then its adapter config
    ckpt = latest_checkpoint(out)
    assert ckpt is not None
    (ckpt.path / checkpoint.STATE_FILE).write_bytes(b"not a torch file")
    r = run_inprocess("lora", *common, "--steps", "4", *other)
    assert r.returncode == 2 and "the checkpoint cannot be read" in r.stderr, r.stderr
    (ckpt.path / checkpoint.ADAPTER_DIR / "adapter_config.json").write_text("{")
    r = run_inprocess("lora", *common, "--steps", "4", *other)
    assert r.returncode == 2 and "the checkpoint cannot be read" in r.stderr, r.stderr


def test_merged_model_loads_alone_and_the_run_ends_with_a_sample(
    run_inprocess: RunInprocess, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    r = run_inprocess(
        "lora", *TINY, *SMALL, "--steps", "4", "--merge", "--generate-prompt", "Tensor cores",
        "--generate-tokens", "12", "--output-dir", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    merged_dir = out / "merged"
    assert s["merged_dir"] == str(merged_dir) and "merged model" in r.stdout
    assert str(merged_dir) in r.stdout

    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    adapted = lora.load_adapter(out / "adapter", "cpu").eval()
    check = torch.load(out / "adapter" / lora.CHECK_FILE)
    with torch.no_grad():
        got = merged(input_ids=check["input_ids"]).logits.float()
        want = adapted(input_ids=check["input_ids"]).logits.float()
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        with adapted.disable_adapter():
            base = adapted(input_ids=check["input_ids"]).logits.float()
    assert (base - got).abs().max() > 1e-2  # the adapter is in the merged weights

    # The sample: 12 new tokens after the prompt, greedy, from the trained model.
    assert s["sample_prompt"] == "Tensor cores" and s["sample_tokens"] == 12
    assert s["sample_untrained_base"] is True
    tok = llm.ByteTokenizer()
    ids = [tok.bos_token_id, *tok.encode("Tensor cores")]
    with torch.no_grad():
        for _ in range(12):
            logits = adapted(input_ids=torch.tensor([ids])).logits[0, -1, :256]
            ids.append(int(logits.argmax()))
    assert s["sample"] == tok.decode(ids[-12:])
    assert json.dumps(s["sample"], ensure_ascii=False) in r.stdout
    assert "untrained" in r.stdout and "12 tokens" in r.stdout


def test_merge_refuses_four_bit_weights(run_inprocess: RunInprocess) -> None:
    r = run_inprocess("lora", *TINY, "--steps", "2", "--merge", "--load-in-4bit")
    assert r.returncode == 2 and "--merge with --load-in-4bit" in r.stderr
