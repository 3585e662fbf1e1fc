"""A runner-shaped module for the launch form's tests: a parser and nothing heavy."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fake")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps to run")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16", "fp16"), default="bf16", help="number format"
    )
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=True, help="torch.compile it"
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), help="where to run")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    parser.add_argument("--simulate-oom-at-step", type=int, help=argparse.SUPPRESS)
    return parser
