"""The `tensile-descheduler` command."""

import sys

from vnode._unimplemented import exit_not_implemented


def main() -> int:
    """Run the descheduler; returns the exit code."""
    return exit_not_implemented("tensile-descheduler")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
