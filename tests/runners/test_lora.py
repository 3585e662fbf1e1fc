"""LoRA runner: loss falls on the shipped corpus, the adapter reloads, local checkpoints train."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpustation.runners import lora
from gpustation.runners.lib import llm
from tests.runners.conftest import RunInprocess, RunRunner

TINY = (
    "--device", "cpu", "--model-preset", "tiny", "--no-compile", "--precision", "fp32",
    "--warmup-steps", "1",
)  # fmt: skip


def test_loss_falls_on_shipped_corpus_and_adapter_reloads(run_runner: RunRunner) -> None:
    r = run_runner(
        "lora", *TINY, "--seq-len", "64", "--batch-size", "8", "--steps", "40",
        "--log-every", "5", "--lr", "0.003", "--eval-every", "20",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    losses = [e["loss"] for e in r.steps if "loss" in e]
    assert len(losses) == 9  # steps 1, 5, 10, ..., 40
    # the held-out split's loss, every 20 steps and at the end, falls too
    evals = [(e["step"], e["eval_loss"]) for e in r.steps if "eval_loss" in e]
    assert [step for step, _ in evals] == [20, 40]
    assert evals[-1][1] < 5.0 and s["eval_loss"] == evals[-1][1] and s["eval_sequences"] >= 1
    # Over 40 steps the byte-level loss must drop well below its start (ln 259 ~ 5.56).
    assert s["first_loss"] > 5.0
    assert s["final_loss"] < s["first_loss"] - 0.4
    assert min(losses[-3:]) < min(losses[:3])
    assert s["tokens_per_s"] > 0 and s["model_tflops_per_s"] > 0
    assert s["trainable_params"] < s["params"]
    assert s["adapter_reload_ok"] is True
    (static,) = [e["mem_static_mib"] for e in r.events if "mem_static_mib" in e]
    assert 0 < static <= s["mem_peak_mib"]

    # Independently of the runner's own check: rebuild base + adapter here and
    # compare with the logits the trained model produced before it was saved.
    adapter = Path(s["adapter_dir"])
    assert (adapter / "adapter_model.safetensors").exists()
    check = torch.load(adapter / lora.CHECK_FILE)
    model = lora.load_adapter(adapter, "cpu").eval()
    with torch.no_grad():
        logits = model(input_ids=check["input_ids"]).logits.float()
        torch.testing.assert_close(logits, check["logits"], rtol=1e-4, atol=1e-4)
        # The adapter matters: without it the base model answers differently.
        with model.disable_adapter():
            base_logits = model(input_ids=check["input_ids"]).logits.float()
    assert (base_logits - check["logits"]).abs().max() > 1e-2


def _save_tiny_checkpoint(path: Path) -> None:
    """A tiny Llama with a real (BPE) Hugging Face tokenizer, saved like any checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(llm.shipped_corpus().split("\n\n"), trainer)
    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    hf_tok.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(hf_tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, bos_token_id=hf_tok.bos_token_id,
        eos_token_id=hf_tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)


def test_local_checkpoint_with_instruction_data(run_runner: RunRunner, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save_tiny_checkpoint(ckpt)
    data = tmp_path / "train.jsonl"
    rows = [
        {"instruction": "Name a fast number format.", "input": "", "output": "bfloat16"},
        {"instruction": "Fix a starving GPU", "input": "a DataLoader", "output": "more workers"},
        {"prompt": "Gradient checkpointing saves ", "completion": "memory."},
        {"text": "Packing removes padding."},
    ]  # fmt: skip
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    r = run_runner(
        "lora", *TINY, "--model", str(ckpt), "--data", str(data), "--seq-len", "32",
        "--batch-size", "4", "--steps", "6", "--log-every", "2",
        "--target-modules", "q_proj,v_proj", "--gradient-checkpointing", "--merge",
        "--generate-prompt", "Packing removes",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = r.summary
    assert s["model"] == str(ckpt)
    # The merged model keeps the checkpoint's tokenizer; the sample is decoded with it
    # and is not said to come from an untrained base.
    assert (Path(s["merged_dir"]) / "tokenizer.json").exists()
    assert 1 <= s["sample_tokens"] <= 32 and s["sample_untrained_base"] is False
    assert s["sample_prompt"] == "Packing removes" and "untrained" not in r.stdout
    assert s["adapter_reload_ok"] is True
    adapter = Path(s["adapter_dir"])
    info = json.loads((adapter / llm.BASE_INFO_FILE).read_text())
    assert info == {"kind": "path", "model_path": str(ckpt.resolve()), "load_in_4bit": False}
    # The checkpoint's own tokenizer was used, and saved beside the adapter.
    assert (adapter / "tokenizer.json").exists()
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    assert sorted(cfg["target_modules"]) == ["q_proj", "v_proj"]


def test_instruction_records_mask_the_prompt(tmp_path: Path) -> None:
    tok = llm.ByteTokenizer()
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"instruction": "Say hi", "input": "", "output": "hi"}) + "\n")
    ids, labels = llm.token_stream(str(path), tok)
    response = [*tok.encode("hi"), tok.eos_token_id]
    # The loss is taken on the response only: every prompt position is masked.
    assert ids[-len(response) :] == response
    assert labels[-len(response) :] == response
    assert set(labels[: -len(response)]) == {-100}
    assert tok.decode(ids).startswith("### Instruction:\nSay hi")


def test_bad_jsonl_record_is_a_usage_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\n')
    from gpustation.runners.lib.common import RunnerError

    with pytest.raises(RunnerError, match="instruction/input/output"):
        llm.token_stream(str(bad), llm.ByteTokenizer())


def test_packing_fills_whole_sequences_and_shards_ranks() -> None:
    ids = list(range(100))
    blocks = llm.pack(ids, ids, seq_len=16, min_blocks=1)
    assert blocks.shape == (6, 2, 16)
    assert blocks[1, 0].tolist() == list(range(16, 32))
    small = llm.pack(list(range(10)), list(range(10)), seq_len=16, min_blocks=3)
    assert small.shape[0] >= 3  # short data is repeated to fill the batch
    s0 = llm.BatchSampler(blocks, 2, steps=3, seed=1, device=torch.device("cpu"), rank=0,
                          world_size=2)  # fmt: skip
    s1 = llm.BatchSampler(blocks, 2, steps=3, seed=1, device=torch.device("cpu"), rank=1,
                          world_size=2)  # fmt: skip
    x0, _ = s0.batch(0)
    x1, _ = s1.batch(0)
    assert x0.shape == (2, 16)
    # The two ranks draw different sequences in the same step.
    assert {tuple(r.tolist()) for r in x0}.isdisjoint({tuple(r.tolist()) for r in x1})


def test_one_b_preset_is_about_a_billion_parameters() -> None:
    cfg = llm.llama_config("1b", llm.ByteTokenizer(), 2048)
    with torch.device("meta"):
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert 0.9e9 < n < 1.2e9
    assert cfg.vocab_size == 32000


def test_big_base_models_check_the_adapter_on_the_loaded_base(
    run_inprocess: RunInprocess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Above the size limit the check loads the saved adapter beside the trained one
    # instead of building a second copy of the base.
    monkeypatch.setattr(lora, "REBUILD_MAX_PARAMS", 0)
    r = run_inprocess(
        "lora", *TINY, "--seq-len", "32", "--batch-size", "4", "--steps", "4", "--lr", "0.01"
    )
    assert r.returncode == 0, r.stderr
    assert r.summary["adapter_reload_ok"] is True
    assert "adapter reload check" in r.stdout
