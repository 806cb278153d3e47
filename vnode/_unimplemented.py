"""The exit of a command whose program is not built yet."""

import sys

EXIT_USAGE = 2


def exit_not_implemented(program: str) -> int:
    """Say that `program` is not implemented yet and return the usage exit code (2)."""
    print(f"{program}: not implemented yet", file=sys.stderr)
    return EXIT_USAGE
