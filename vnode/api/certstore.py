"""Where CSR-issued serving certificates are kept between runs: what the certificate
manager needs of a store (`ServingCertificateStore`), and the directory store
(`--cert-dir`, `CertificateStore`). The Secret store (`--cert-secret`) is
`vnode.api.secretstore`.

The directory is kept like the kubelet's certificate store: `kubelet-server-<timestamp>.pem`
files (chain + key, mode 0600) and the `kubelet-server-current.pem` symlink naming the one
in use. The symlink is relative (the directory can be moved or mounted elsewhere) and
replaced atomically, so a reader sees the old or the new certificate, never half of one.
Only the current and the previous certificate files are kept (`certificates.stale_files`
says why).

The directory store's synchronous methods do blocking file I/O (save fsyncs); its
`ServingCertificateStore` methods (`read`, `write`) run them in a thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vnode.api.certificates import CURRENT_FILE, stale_files, stamped_file_name

logger = logging.getLogger(__name__)

_DIR_MODE = 0o700
_FILE_MODE = 0o600


class StoreError(Exception):
    """The store could not be read or written; the message names it and says why."""


@dataclass(frozen=True, kw_only=True)
class StoredCertificate:
    """A certificate read from a store."""

    pem: bytes
    """The certificate chain, then its private key (`certificates.bundle`)."""
    where: str
    """Where it was read from, for logs (a file, a Secret's key)."""


class ServingCertificateStore(Protocol):
    """Keeps one node's current serving certificate between runs."""

    @property
    def location(self) -> str:
        """Where certificates are kept, for logs (a directory, a Secret)."""

    async def read(self) -> StoredCertificate | None:
        """Return the stored current certificate, or None when there is none. Raises
        StoreError when the store cannot be read."""

    async def write(self, pem: bytes, *, now: dt.datetime) -> str:
        """Store `pem` (chain then key) as the current certificate, obtained at `now`;
        return where it went, for logs. Raises StoreError when it cannot be stored."""


class CertificateStore:
    """Reads and writes one node's serving certificates in `directory` (`--cert-dir`); a
    `ServingCertificateStore`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @property
    def location(self) -> str:
        """The directory."""
        return str(self.directory)

    async def read(self) -> StoredCertificate | None:
        """Return the current certificate file's content and path (the file its pointer
        names), or None without one. Raises StoreError when it cannot be read."""
        try:
            pem = await asyncio.to_thread(self.load_current)
        except OSError as exc:
            raise StoreError(f"cannot read {self.current}: {exc}") from exc
        if pem is None:
            return None
        target = await asyncio.to_thread(self.current_target)
        return StoredCertificate(pem=pem, where=str(target or self.current))

    async def write(self, pem: bytes, *, now: dt.datetime) -> str:
        """`save` in a thread; return the new file's path. Raises StoreError."""
        try:
            path = await asyncio.to_thread(self.save, pem, now=now)
        except OSError as exc:
            raise StoreError(f"cannot store it in {self.directory}: {exc}") from exc
        return str(path)

    @property
    def current(self) -> Path:
        """The path of the `kubelet-server-current.pem` pointer."""
        return self.directory / CURRENT_FILE

    def check_writable(self) -> None:
        """Make the directory (0700, with its parents) if it is missing, then create, write
        and delete a probe file in it: what `save` will need, checked before a certificate
        is requested. Raises OSError saying what failed (not a directory, read-only file
        system, permissions...)."""
        self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=self.directory)
        try:
            os.write(fd, b"tensile")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)

    def load_current(self) -> bytes | None:
        """Return the content of the current certificate file, or None if there is none.
        Raises OSError for other failures (permissions, a directory in its place)."""
        try:
            return self.current.read_bytes()
        except FileNotFoundError:
            return None

    def current_target(self) -> Path | None:
        """Return the file the current pointer names, or None without one. A pointer that
        is not a symlink (a regular file, e.g. restored with `cp -L`) or cannot be read as
        one is its own target: it still holds the certificate. Raises nothing."""
        try:
            return self.directory / os.readlink(self.current)
        except FileNotFoundError:
            return None
        except OSError:
            return self.current

    def save(self, content: bytes, *, now: dt.datetime) -> Path:
        """Write `content` as `kubelet-server-<now>.pem` (0600, in a 0700 directory made if
        missing), point `kubelet-server-current.pem` at it, and delete the certificate
        files older than the one it pointed at before; return the new file's path.
        Raises OSError when the directory cannot be written (a file that cannot be deleted
        is only logged: the new certificate is in place)."""
        self.directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
        previous = self.current_target()
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
        keep = {path.name} | ({previous.name} if previous is not None else set())
        for name in stale_files(os.listdir(self.directory), keep=keep):
            try:
                (self.directory / name).unlink(missing_ok=True)
            except OSError as exc:
                logger.warning("kubelet API: cannot delete the old certificate %s: %s", name, exc)
        return path
