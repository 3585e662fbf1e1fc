"""A run whose metrics file holds every kind of bad line, then a good last one.

The number of bad lines is BAD (tests import it): each must be counted as
malformed and skipped, and the run must still succeed and be listed.
"""

import os
import sys

BAD = [
    "[" * 3000,  # nesting deeper than the parser's stack
    "{" * 3000,
    '{"t": 1, "step": 9223372036854775808, "loss": 1.0}',  # a step of 2^63
    '{"t": 1, "step": 1, "summary": {"n": 100000000000000000000000}}',
    '{"t": 1, "step": 1, "loss": NaN}',
    '{"t": 1, "step": 1, "loss": Infinity}',
    '{"t": 1, "step": 1, "throughput": -Infinity}',
    '{"t": 1, "step": 1, "loss": 1e400}',  # overflows to infinity
    '{"t": 1, "step": 1, "summary": {"acc": NaN}}',
    '{"t": 1, "step": 1, "other": [1, -Infinity]}',
    '{"t": 1, "step": "ten"}',
    '{"t": 1, "step": 2, "loss": [1]}',
    '{"t": 1, "step": true}',
    '{"t": "soon", "step": 2}',
    '{"t": 1, "step": 2, "unit": 5}',
    '{"t": 1, "step": 2, "summary": [1, 2]}',
    '{"t": 1, "step": 2, "total_steps": 1.5}',
    '"a string"',
]
#: the bad lines above, one not UTF-8, and one line of argv[1] megabytes
COUNT = len(BAD) + 2


def main() -> None:
    long_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    path = os.environ["GPUSTATION_METRICS_FILE"]
    with open(path, "ab") as fh:
        fh.write(b'{"t": 0.5, "step": 1, "loss": 2.0, "total_steps": 5}\n')
        for line in BAD:
            fh.write(line.encode() + b"\n")
        fh.write(b'{"t": 1, "step": 2, "unit": "\xff\xfe"}\n')
        # A line of long_mb MiB before its newline comes, written in pieces.
        fh.write(b'{"t": 1, "step": 3, "pad": "')
        piece = b"x" * (1 << 20)
        for _ in range(long_mb):
            fh.write(piece)
            fh.flush()
        fh.write(b'"}\n')
        fh.write(b'{"t": 2, "step": 5, "loss": 0.5, "throughput": 10.0, "unit": "img/s"}\n')
        fh.write(b'{"t": 2, "summary": {"accuracy": 0.75}}\n')
    print("wrote bad metrics", flush=True)


if __name__ == "__main__":
    main()
