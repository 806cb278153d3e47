"""The `virtual-node` command (flags + env -> settings -> run)."""

import sys

from vnode._unimplemented import exit_not_implemented


def main() -> int:
    """Run the virtual node; returns the exit code."""
    return exit_not_implemented("virtual-node")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
