"""The `tensile-webhook` command."""

import sys

from vnode._unimplemented import exit_not_implemented


def main() -> int:
    """Run the webhook; returns the exit code."""
    return exit_not_implemented("tensile-webhook")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
