"""Language-model pieces shared by the lora, infer and batchsize runners.

With no ``--model`` a small Llama-style model is built from a config with
random weights (nothing is downloaded) and text is tokenised by bytes; with
``--model PATH`` any local Hugging Face causal-LM checkpoint and its tokenizer
are loaded. Training text is packed into full sequences so no step computes
on padding.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from gpustation.runners.lib import common

# Llama-style shapes. "default" trains visibly within a few hundred steps on a
# GPU; "1b" is a ~1B-parameter config for benchmarks; "tiny" is for CPU tests.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        # A frozen random lm_head caps the logits at about init_std * hidden:
        # at hidden 64 the usual 0.02 would leave LoRA unable to move the loss.
        "initializer_range": 0.1,
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
    },
    "default": {
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
    },
    "1b": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
    },
}

CORPUS = "corpus.txt"
BASE_INFO_FILE = "gpustation_base.json"


class ByteTokenizer:
    """Bytes 0-255 plus bos/eos/pad: needs no vocabulary file and no download."""

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class HFTokenizer:
    """Adapter giving a Hugging Face tokenizer the same small interface as ByteTokenizer."""

    def __init__(self, tok: Any) -> None:
        self.tok = tok
        if tok.pad_token_id is None:
            tok.pad_token = tok.eos_token
        self.bos_token_id = tok.bos_token_id
        self.eos_token_id = tok.eos_token_id
        self.pad_token_id = tok.pad_token_id
        self.vocab_size = len(tok)

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))


Tokenizer = ByteTokenizer | HFTokenizer


def add_model_args(parser: Any) -> None:
    """``--model`` / ``--model-preset`` / ``--seq-len`` shared by the language-model runners."""
    parser.add_argument(
        "--model",
        default=None,
        help="a local Hugging Face causal-LM checkpoint directory (default: build a "
        "Llama-style model from --model-preset with random weights, byte tokenizer)",
    )
    parser.add_argument(
        "--model-preset",
        choices=sorted(MODEL_PRESETS),
        default="default",
        help="shape of the model built when no --model is given",
    )
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per sequence")


def llama_config(
    preset: str,
    tokenizer: ByteTokenizer,
    max_positions: int,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """The LlamaConfig of a preset, sized for the byte tokenizer unless it says otherwise;
    ``overrides`` replaces shape keys (``num_hidden_layers``, ``hidden_size``, ...)."""
    # start-up time: transformers, only where it is used
    from transformers import LlamaConfig

    shape = {**MODEL_PRESETS[preset], **(overrides or {})}
    # Round the byte vocabulary up to a multiple of 8 for tensor-core friendly shapes.
    vocab = shape.pop("vocab_size", 8 * math.ceil(tokenizer.vocab_size / 8))
    return LlamaConfig(
        vocab_size=vocab,
        max_position_embeddings=max(2048, max_positions),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        use_cache=False,
        **shape,
    )


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Tokenizer
    info: dict[str, Any]  # how to rebuild the base model (saved beside adapters)


def build_from_preset(
    preset: str,
    seed: int,
    device: torch.device,
    dtype: torch.dtype,
    max_positions: int,
    overrides: dict[str, Any] | None = None,
) -> LoadedModel:
    """A Llama-style model with random weights, reproducible from (preset, seed, overrides)."""
    # start-up time: transformers, only where it is used
    from transformers import LlamaForCausalLM

    tok = ByteTokenizer()
    config = llama_config(preset, tok, max_positions, overrides)
    # Small models are initialised on the CPU so the same seed gives the same
    # weights wherever they are reloaded; big ones are built on the device in
    # their final dtype, which takes seconds instead of a minute.
    n_est = config.num_hidden_layers * (
        4 * config.hidden_size**2 + 3 * config.hidden_size * config.intermediate_size
    )
    init_device = torch.device("cpu") if n_est < 200e6 else device
    torch.manual_seed(seed)
    if init_device.type == "cuda":
        torch.cuda.manual_seed(seed)
    with torch.device(init_device):
        model = LlamaForCausalLM._from_config(
            config,
            dtype=dtype if init_device == device else torch.float32,
            attn_implementation="sdpa",
        )
    model = model.to(device=device, dtype=dtype)
    info = {
        "kind": "preset",
        "model_preset": preset,
        "seed": seed,
        "init_device": init_device.type,
        "max_positions": max_positions,
    }
    if overrides:
        info["overrides"] = dict(overrides)
    return LoadedModel(model=model, tokenizer=tok, info=info)


def load_pretrained(
    path: str, device: torch.device, dtype: torch.dtype, load_in_4bit: bool = False
) -> LoadedModel:
    """A local Hugging Face checkpoint and its tokenizer (no network access is attempted)."""
    # start-up time: transformers, only where it is used
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not Path(path).is_dir():
        raise common.RunnerError(
            f"--model {path}: no such directory; give a local checkpoint directory "
            "(with config.json and weights)",
            common.EXIT_USAGE,
        )
    tok = HFTokenizer(AutoTokenizer.from_pretrained(path, local_files_only=True))
    kwargs: dict[str, Any] = {"dtype": dtype, "local_files_only": True}
    if load_in_4bit:
        kwargs.update(_four_bit_kwargs(device))
    try:
        model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa", **kwargs)
    except (ValueError, ImportError):
        # Architectures without an SDPA path fall back to their default attention.
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if not load_in_4bit:
        # transformers wraps PreTrainedModel.to in a decorator whose type drops self
        model = model.to(device)  # type: ignore[arg-type]
    model.config.use_cache = False
    info = {"kind": "path", "model_path": str(Path(path).resolve()), "load_in_4bit": load_in_4bit}
    return LoadedModel(model=model, tokenizer=tok, info=info)


def _four_bit_kwargs(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        raise common.RunnerError(
            "--load-in-4bit needs a CUDA GPU (bitsandbytes kernels)", common.EXIT_USAGE
        )
    try:
        # guarded: without it --load-in-4bit says what to install
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise common.RunnerError(
            "--load-in-4bit needs bitsandbytes: pip install bitsandbytes", common.EXIT_USAGE
        ) from exc
    # start-up time: transformers, only where it is used
    from transformers import BitsAndBytesConfig

    return {
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        ),
        "device_map": {"": device.index or 0},
    }


def load_model(
    args: Any, device: torch.device, dtype: torch.dtype, load_in_4bit: bool = False
) -> LoadedModel:
    """``--model PATH`` when given, else the ``--model-preset`` built from a config."""
    if args.model:
        return load_pretrained(args.model, device, dtype, load_in_4bit)
    return build_from_preset(args.model_preset, args.seed, device, dtype, args.seq_len)


def rebuild_base(info: dict[str, Any], device: torch.device, dtype: torch.dtype) -> LoadedModel:
    """Rebuild the base model an adapter was trained on, from its saved description."""
    if info["kind"] == "path":
        return load_pretrained(info["model_path"], device, dtype, info.get("load_in_4bit", False))
    return build_from_preset(
        info["model_preset"],
        info["seed"],
        device,
        dtype,
        info.get("max_positions", 2048),
        info.get("overrides"),
    )


def save_base_info(directory: Path, info: dict[str, Any]) -> None:
    (directory / BASE_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def read_base_info(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / BASE_INFO_FILE).read_text(encoding="utf-8"))
    return data


# ----------------------------------------------------------------------------- data


def shipped_corpus() -> str:
    """The plain-English text about GPUs and training that ships with gpustation."""
    return (resources.files("gpustation.runners") / "data" / CORPUS).read_text(encoding="utf-8")


def _record_to_pair(rec: dict[str, Any], where: str) -> tuple[str, str]:
    """(prompt, response) of one JSON Lines record; the loss is taken on the response only."""
    if "instruction" in rec and "output" in rec:
        prompt = f"### Instruction:\n{rec['instruction']}\n\n"
        if rec.get("input"):
            prompt += f"### Input:\n{rec['input']}\n\n"
        return prompt + "### Response:\n", str(rec["output"])
    if "prompt" in rec and "completion" in rec:
        return str(rec["prompt"]), str(rec["completion"])
    if "text" in rec:
        return "", str(rec["text"])
    raise common.RunnerError(
        f"{where}: expected instruction/input/output, prompt/completion or text keys, "
        f"got {sorted(rec)}",
        common.EXIT_USAGE,
    )


def token_stream(data: str | None, tok: Tokenizer) -> tuple[list[int], list[int]]:
    """Token ids and labels (-100 where no loss is taken) for a corpus or a JSONL file."""
    ids: list[int] = []
    labels: list[int] = []
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    eos = [tok.eos_token_id] if tok.eos_token_id is not None else []
    if data is None or not data.endswith(".jsonl"):
        text = shipped_corpus() if data is None else Path(data).read_text(encoding="utf-8")
        for para in text.split("\n\n"):
            if para.strip():
                piece = bos + tok.encode(para.strip() + "\n") + eos
                ids += piece
                labels += piece
        return ids, labels
    path = Path(data)
    if not path.is_file():
        raise common.RunnerError(f"--data {data}: no such file", common.EXIT_USAGE)
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise common.RunnerError(f"{data}:{n}: not JSON: {exc}", common.EXIT_USAGE) from exc
        prompt, response = _record_to_pair(rec, f"{data}:{n}")
        p = bos + tok.encode(prompt)
        r = tok.encode(response) + eos
        ids += p + r
        labels += [-100] * len(p) + r
    return ids, labels


def pack(ids: list[int], labels: list[int], seq_len: int, min_blocks: int = 1) -> torch.Tensor:
    """Cut the stream into full sequences: a (blocks, 2, seq_len) tensor of ids and labels.

    A stream shorter than ``min_blocks`` sequences is repeated so that small
    instruction files still fill whole batches.
    """
    if not ids:
        raise common.RunnerError("the training data holds no text", common.EXIT_USAGE)
    need = seq_len * max(1, min_blocks)
    if len(ids) < need:
        reps = math.ceil(need / len(ids))
        ids, labels = ids * reps, labels * reps
    n = len(ids) // seq_len
    t = torch.tensor([ids[: n * seq_len], labels[: n * seq_len]], dtype=torch.long)
    return t.view(2, n, seq_len).transpose(0, 1).contiguous()


class BatchSampler:
    """Draws batches of packed sequences on the device with no host work per step.

    Each rank takes its own slice of one seeded permutation per epoch, so
    data-parallel ranks see different sequences.
    """

    def __init__(
        self,
        blocks: torch.Tensor,
        batch_size: int,
        steps: int,
        seed: int,
        device: torch.device,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.blocks = blocks.to(device)
        self.batch_size = batch_size
        g = torch.Generator().manual_seed(seed)
        need = steps * batch_size * world_size
        perms = []
        total = 0
        while total < need:
            perms.append(torch.randperm(len(blocks), generator=g))
            total += len(blocks)
        order = torch.cat(perms)[:need].view(steps, world_size, batch_size)[:, rank]
        self.order = order.to(device)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Input ids and labels for 0-based ``step``."""
        b = self.blocks[self.order[step]]
        return b[:, 0], b[:, 1]


def matmul_params(model: Any) -> int:
    """Parameters that take part in matmuls: everything but the input embedding table."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    total: int = sum(p.numel() for n, p in base.named_parameters() if "lora_" not in n)
    emb: torch.Tensor = base.get_input_embeddings().weight
    out = base.get_output_embeddings()
    tied = out is not None and out.weight is emb
    return total - emb.numel() + (emb.numel() if tied else 0)


def train_flops_per_token(model: Any, seq_len: int) -> float:
    """Model FLOPs per trained token with a frozen base (LoRA), recomputation excluded.

    Forward: 2N for the matmuls plus 2·layers·seq·hidden for causal attention.
    Backward needs gradients for the activations only (the base is frozen):
    2N again, and twice the forward attention work.
    """
    cfg = model.config
    n = matmul_params(model)
    attn: int = cfg.num_hidden_layers * seq_len * cfg.hidden_size
    return 4.0 * n + 6.0 * attn
