"""The directory that keeps CSR-issued serving certificates (`--cert-dir`), like the
kubelet's certificate store: `kubelet-server-<timestamp>.pem` files (chain + key, mode
0600) and the `kubelet-server-current.pem` symlink naming the one in use.

The symlink is relative (the directory can be moved or mounted elsewhere) and replaced
atomically, so a reader sees the old or the new certificate, never half of one.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from vnode.api.certificates import CURRENT_FILE, stamped_file_name

_DIR_MODE = 0o700
_FILE_MODE = 0o600


class CertificateStore:
    """Reads and writes one node's serving certificates in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def current(self) -> Path:
        """The path of the `kubelet-server-current.pem` pointer."""
        return self.directory / CURRENT_FILE

    def load_current(self) -> bytes | None:
        """Return the content of the current certificate file, or None if there is none.
        Raises OSError for other failures (permissions, a directory in its place)."""
        try:
            return self.current.read_bytes()
        except FileNotFoundError:
            return None

    def current_target(self) -> Path | None:
        """Return the file the current pointer names (resolved), or None without one."""
        try:
            return self.directory / os.readlink(self.current)
        except FileNotFoundError:
            return None

    def save(self, content: bytes, *, now: dt.datetime) -> Path:
        """Write `content` as `kubelet-server-<now>.pem` (0600, in a 0700 directory made if
        missing) and point `kubelet-server-current.pem` at it; return the new file's path.
        Raises OSError when the directory cannot be written."""
        self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        path = self.directory / stamped_file_name(now)
        partial = path.with_name(path.name + ".tmp")
        partial.unlink(missing_ok=True)
        # O_EXCL + an explicit mode: the key is never readable by others, not even for
        # the moment between creating the file and a chmod.
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
        with os.fdopen(fd, "wb") as file:
            file.write(content)
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, path)
        link = self.current.with_name(CURRENT_FILE + ".tmp")
        link.unlink(missing_ok=True)
        link.symlink_to(path.name)
        os.replace(link, self.current)
        return path
