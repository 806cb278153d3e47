"""Assemble the image's root filesystem in the Dockerfile's build stage: only what runs
Python and tensile, taken from the build stage's own Debian packages (no shell, no package
manager, no pip, no compiler).

Usage: python3 hack/image-rootfs.py --venv /opt/tensile ROOT PACKAGE...

ROOT gets, as the final image's `/`:
- every file of PACKAGE..., of the packages owning the shared libraries that the venv's
  extension modules load (found with ldd), and of the packages these depend on (Depends and
  Pre-Depends, the first installed alternative of each), less documentation other than the
  copyright files; dpkg and debconf, which only install and configure packages, are left
  out (readline-common names dpkg to register an info page);
- /var/lib/dpkg/status with those packages' records, so SBOM tools and scanners see which
  Debian packages (and versions) the image holds;
- the venv, without what tensile never imports (the kubernetes client's asyncio copy,
  kubernetes/aio) and with the generated OpenAPI classes of the kubernetes client (its api
  and models packages, imported whole by `import kubernetes`) as bytecode only;
- bytecode for the standard library (the root is read-only at run time: nothing can write it
  later), /etc/passwd and /etc/group naming root and nonroot (65532), an empty /tmp.
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# Packages that install and configure other packages: nothing at run time needs them.
INSTALL_ONLY = frozenset({"dpkg", "debconf", "debconf-2.0", "install-info"})
STATUS = Path("/var/lib/dpkg/status")
INFO = Path("/var/lib/dpkg/info")
NONROOT = 65532


def parse_status(text: str) -> dict[str, dict[str, str]]:
    """The installed packages of a dpkg status file (`text`), by name: their fields, with
    `_record` holding the stanza as written (deb-control(5) syntax)."""
    packages: dict[str, dict[str, str]] = {}
    for stanza in text.strip().split("\n\n"):
        fields: dict[str, str] = {"_record": stanza.strip()}
        name = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and name:
                fields[name] += "\n" + line
            elif ":" in line:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            packages[fields["Package"]] = fields
    return packages


def dependencies(fields: Mapping[str, str]) -> list[list[str]]:
    """The Pre-Depends and Depends of one package as groups of alternative names (version
    constraints and `:any` qualifiers dropped)."""
    groups = []
    for field in ("Pre-Depends", "Depends"):
        for group in filter(None, (g.strip() for g in fields.get(field, "").split(","))):
            names = [re.sub(r"\s*\(.*?\)|:\w+", "", alt).strip() for alt in group.split("|")]
            groups.append([n for n in names if n])
    return groups


def closure(
    installed: Mapping[str, Mapping[str, str]], roots: Iterable[str], *, skip: frozenset[str]
) -> set[str]:
    """The installed packages that `roots` need to run: the roots and, transitively, the
    first installed alternative of each dependency group (a virtual name resolves to an
    installed package providing it); names in `skip` and what only they need are left out.
    Raises KeyError for a root that is not installed."""
    providers: dict[str, str] = {}
    for name, fields in installed.items():
        for provided in fields.get("Provides", "").split(","):
            providers.setdefault(re.sub(r"\s*\(.*?\)", "", provided).strip(), name)
    wanted: set[str] = set()
    todo = [name for name in roots if name not in skip]
    for name in todo:
        if name not in installed:
            raise KeyError(f"{name} is not installed")
    while todo:
        name = todo.pop()
        if name in wanted:
            continue
        wanted.add(name)
        for group in dependencies(installed[name]):
            chosen = next(
                (
                    (n if n in installed else providers[n])
                    for n in group
                    if n in installed or n in providers
                ),
                None,
            )
            if chosen is None:
                raise KeyError(f"{name} needs one of {' | '.join(group)}: none is installed")
            if chosen not in skip and group[0] not in skip:
                todo.append(chosen)
    return wanted


def kept(path: str) -> bool:
    """Whether a packaged file goes into the image: not documentation, manual pages,
    translations or info pages (copyright files stay: they are the licences)."""
    if path.startswith("/usr/share/doc/"):
        return path.endswith("/copyright")
    return not path.startswith(
        ("/usr/share/man/", "/usr/share/locale/", "/usr/share/info/", "/usr/share/lintian/")
    )


def package_files(name: str) -> list[str]:
    """The paths dpkg recorded for an installed package (its .list file, with or without
    the architecture qualifier)."""
    for candidate in sorted(INFO.glob(f"{name}.list")) + sorted(INFO.glob(f"{name}:*.list")):
        return [line for line in candidate.read_text().splitlines() if line and line != "/."]
    raise FileNotFoundError(f"dpkg has no file list for {name}")


def library_packages(venv: Path) -> set[str]:
    """The packages owning the shared libraries that the venv's extension modules load."""
    owners: dict[str, str] = {}
    for listing in INFO.glob("*.list"):
        name = listing.name.removesuffix(".list").split(":")[0]
        for line in listing.read_text().splitlines():
            if ".so" in line and os.path.isfile(line):
                owners[os.path.realpath(line)] = name
    needed: set[str] = set()
    for module in (*venv.rglob("*.so"), *venv.rglob("*.so.*")):
        ldd = subprocess.run(["ldd", str(module)], capture_output=True, text=True, check=False)
        for match in re.finditer(r"=> (/\S+)", ldd.stdout):
            real = os.path.realpath(match.group(1))
            if real in owners:
                needed.add(owners[real])
            elif not real.startswith(str(venv)):
                raise RuntimeError(f"{module} loads {real}, which no package owns")
    return needed


def copy_entry(source: str, root: Path) -> None:
    """Copy one file, symbolic link or directory (not its contents) below `root`, keeping
    modes and times; parents that are symbolic links in `root` (the merged /usr's /lib)
    are followed."""
    target = root / source.lstrip("/")
    if os.path.islink(source):
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(source), target)
    elif os.path.isdir(source):
        if not os.path.lexists(target):
            target.mkdir(parents=True)
            shutil.copystat(source, target)
    elif os.path.isfile(source):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)


def trim_venv(venv: Path) -> None:
    """Leave out of the venv what tensile never imports, and ship the kubernetes client's
    generated classes as bytecode only (about 33 MB of source nobody reads in a pod)."""
    site = next(venv.glob("lib/python3*/site-packages"))
    shutil.rmtree(site / "kubernetes" / "aio", ignore_errors=True)
    for generated in (
        site / "kubernetes" / "client" / "api",
        site / "kubernetes" / "client" / "models",
    ):
        # Legacy placement (x.pyc beside x.py) is what imports without a source file.
        compileall.compile_dir(generated, quiet=1, legacy=True)
        for source in generated.rglob("*.py"):
            source.unlink()
        for cache in generated.rglob("__pycache__"):
            shutil.rmtree(cache)
    compileall.compile_dir(venv, quiet=1)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="the venv to ship (its path)")
    parser.add_argument("root", type=Path, help="where to assemble the root filesystem")
    parser.add_argument("packages", nargs="+", help="the Debian packages to ship")
    args = parser.parse_args(argv)
    root: Path = args.root
    root.mkdir(parents=True, exist_ok=True)
    # The merged /usr's top-level links (/lib -> usr/lib, ...) first, so files dpkg lists
    # under /lib land in /usr/lib as they do here.
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        if os.path.islink(f"/{top}"):
            (root / top).parent.joinpath(os.readlink(f"/{top}")).mkdir(parents=True, exist_ok=True)
            copy_entry(f"/{top}", root)
    installed = parse_status(STATUS.read_text())
    wanted = closure(installed, [*args.packages, *library_packages(args.venv)], skip=INSTALL_ONLY)
    for name in sorted(wanted):
        for path in package_files(name):
            if kept(path):
                copy_entry(path, root)
    status = root / STATUS.relative_to("/")
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("\n\n".join(installed[n]["_record"] for n in sorted(wanted)) + "\n")
    for release in ("/etc/os-release", "/usr/lib/os-release", "/etc/debian_version"):
        if os.path.exists(release):
            copy_entry(os.path.realpath(release), root)
            copy_entry(release, root)
    python = next(iter(sorted((root / "usr" / "lib").glob("python3.*"))))
    compileall.compile_dir(python, quiet=1, stripdir=str(root), prependdir="/")
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc" / "passwd").write_text(
        f"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT}:{NONROOT}:nonroot:/tmp:/sbin/nologin\n"
    )
    (root / "etc" / "group").write_text(f"root:x:0:\nnonroot:x:{NONROOT}:\n")
    # Mount points a runtime would otherwise make: /run, /mnt; /tmp and /var/tmp as a
    # system has them (the chart mounts an emptyDir over /tmp).
    for directory in ("run", "mnt"):
        (root / directory).mkdir(exist_ok=True)
    for directory in ("tmp", "var/tmp"):
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory).chmod(0o1777)
    trim_venv(args.venv)
    shutil.copytree(args.venv, root / args.venv.relative_to("/"), symlinks=True)
    # The interpreter the venv names (its bin/python3 points at /usr/bin/python3), which
    # Debian's python3-minimal would link; that package's dpkg dependency is not wanted.
    usr_python = root / "usr" / "bin" / "python3"
    if not os.path.lexists(usr_python):
        usr_python.symlink_to(python.name)
    print(f"{root}: {len(wanted)} packages: {' '.join(sorted(wanted))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
