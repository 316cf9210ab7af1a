"""The `theinference` executable: the report's first line first (theinference.cli.early), then the CLI."""

import sys


def main() -> None:
    from theinference.cli import early

    early.announce(sys.argv[1:])
    from theinference.cli.app import main as run_cli

    run_cli()
