"""Every subcommand: parse its options, call the layers below, print.

The only package that imports argparse (runners aside, whose command lines
are their contract). Each module offers ``add_parser(subparsers)`` and
``run(args) -> int``; ``gpustation.cli`` is the table of them.
"""
