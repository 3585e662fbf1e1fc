"""What a LoRA run leaves at its end besides the adapter: a short sample of text
from the trained model, and the adapter merged into its base.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import torch

from gpustation.runners.lib import common, llm
from gpustation.textsafe import safe

MERGED_DIR = "merged"
DEFAULT_PROMPT = "A GPU is"


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--merge",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="at the end, merge the adapter into the base weights and save the plain model "
        "(with its tokenizer, if it has one) to OUTPUT_DIR/merged, loadable with "
        "AutoModelForCausalLM.from_pretrained",
    )
    parser.add_argument(
        "--generate-prompt",
        default=DEFAULT_PROMPT,
        metavar="TEXT",
        help="the prompt of the short greedy sample written to the log and the summary at "
        f'the end (default "{DEFAULT_PROMPT}"; from a model built with random weights the '
        "sample is gibberish)",
    )
    parser.add_argument(
        "--generate-tokens",
        type=int,
        default=32,
        metavar="N",
        help="new tokens in the sample at the end (0: no sample)",
    )


def finish(
    args: argparse.Namespace,
    model: Any,
    tokenizer: llm.Tokenizer,
    prec: common.Precision,
    device: torch.device,
) -> dict[str, Any]:
    """The sample from the trained model, then (last: it unwraps the adapter) the merge."""
    result: dict[str, Any] = {}
    if args.generate_tokens > 0:
        with prec.autocast():
            sample = generate_sample(
                model, tokenizer, args.generate_prompt, args.generate_tokens, device
            )
        result.update(sample, sample_untrained_base=args.model is None)
        print(sample_line(sample, untrained_base=args.model is None), flush=True)
    if args.merge:
        merged = merge_and_save(model, tokenizer, common.output_dir(args))
        result["merged_dir"] = str(merged)
        print(f"saved the merged model (adapter folded into the base) to {merged}", flush=True)
    return result


@torch.no_grad()
def generate_sample(
    model: Any, tokenizer: llm.Tokenizer, prompt: str, tokens: int, device: torch.device
) -> dict[str, Any]:
    """Greedy decoding of ``tokens`` new tokens after ``prompt``: the text and its token count.

    With the byte tokenizer only byte tokens are drawn (never bos/eos/pad), so
    the sample is always ``tokens`` long; a Hugging Face tokenizer may stop at
    its end-of-sequence token.
    """
    prefix = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    ids = prefix + tokenizer.encode(prompt)
    x = torch.tensor([ids], dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {
        "max_new_tokens": tokens,
        "do_sample": False,
        "use_cache": True,
        "pad_token_id": tokenizer.pad_token_id,
        "attention_mask": torch.ones_like(x),
    }
    if isinstance(tokenizer, llm.ByteTokenizer):
        vocab = model.get_output_embeddings().weight.shape[0]
        kwargs["suppress_tokens"] = list(range(256, vocab))
        kwargs["eos_token_id"] = None
    was_training = model.training
    model.eval()
    # Compiled layers would recompile for every new length; decode eagerly.
    stance = getattr(torch.compiler, "set_stance", None)
    eager = stance("force_eager") if stance else contextlib.nullcontext()
    try:
        with eager:
            out = model.generate(input_ids=x, **kwargs)
    finally:
        model.train(was_training)
    new = [int(i) for i in out[0, x.shape[1] :].tolist()]
    return {
        "sample_prompt": prompt,
        "sample": tokenizer.decode(new),
        "sample_tokens": len(new),
    }


def sample_line(result: dict[str, Any], untrained_base: bool) -> str:
    """The log line of a sample, its text quoted so control bytes stay visible escapes."""
    where = (
        " (LoRA on an untrained, randomly initialised base: expect gibberish)"
        if untrained_base
        else ""
    )
    # json.dumps escapes C0 controls; safe() takes DEL and the C1 ones (CSI, OSC) too
    return safe(
        f"sample{where}, {result['sample_tokens']} tokens after "
        f"{json.dumps(result['sample_prompt'], ensure_ascii=False)}: "
        f"{json.dumps(result['sample'], ensure_ascii=False)}"
    )


def merge_and_save(model: Any, tokenizer: llm.Tokenizer, out_dir: Path) -> Path:
    """Merge the adapter into the base weights (``merge_and_unload``) and save the plain
    model, with its tokenizer when it has one, to ``out_dir/merged``.

    The peft wrapper is gone afterwards: call this last.
    """
    merged = model.merge_and_unload()
    merged.config.use_cache = True  # a merged model is for inference
    target = out_dir / MERGED_DIR
    # start-up time: transformers, only where it is used
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar redrawn with \r only clutters the log
    try:
        merged.save_pretrained(target)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if isinstance(tokenizer, llm.HFTokenizer):
        tokenizer.tok.save_pretrained(target)
    return target
