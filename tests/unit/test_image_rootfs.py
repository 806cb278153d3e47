"""hack/image-rootfs.py's choice of Debian packages for the image (pure: a dpkg status
text in, package names out) and hack/chart_values.py's reading of values.yaml comments."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

HACK = Path(__file__).parents[2] / "hack"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"hack_{name}", HACK / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rootfs = load("image-rootfs")
chart_values = load("chart_values")


def stanza(
    name: str, depends: str = "", pre: str = "", provides: str = "", status: str = "installed"
) -> str:
    lines = [f"Package: {name}", f"Status: install ok {status}", "Version: 1"]
    lines += [f"Pre-Depends: {pre}"] * bool(pre) + [f"Depends: {depends}"] * bool(depends)
    lines += [f"Provides: {provides}"] * bool(provides)
    return "\n".join(lines)


STATUS = "\n\n".join(
    [
        stanza(
            "python3.11-minimal",
            pre="libc6 (>= 2.35)",
            depends="libpython3.11-minimal (= 3.11.2), zlib1g",
        ),
        stanza("libpython3.11-minimal", depends="libc6, libssl3 (>= 3.0.0)"),
        stanza("libc6", depends="libgcc-s1"),
        stanza("libgcc-s1", depends="gcc-12-base (= 12.2.0), libc6 (>= 2.35)"),
        stanza("gcc-12-base"),
        stanza("libssl3", depends="libc6"),
        stanza("zlib1g", depends="libc6"),
        stanza("readline-common", depends="dpkg (>= 1.15.4) | install-info"),
        stanza("libreadline8", depends="readline-common, libtinfo6"),
        stanza("libtinfo6", depends="libc6"),
        stanza("dpkg", pre="tar, libzstd1"),
        stanza("tar"),
        stanza("libzstd1"),
        stanza("tzdata", depends="debconf (>= 0.5) | debconf-2.0"),
        stanza("debconf", pre="perl-base"),
        stanza("perl-base"),
        stanza("media-types"),
        stanza(
            "libpython3.11-stdlib",
            depends="media-types | mime-support, libreadline8, libmpdec3:any",
        ),
        stanza("libmpdec3", depends="libc6"),
        stanza("mawk", provides="awk"),
        stanza("needs-awk", depends="awk"),
        stanza("removed", depends="libc6", status="config-files"),
    ]
)


@pytest.mark.parametrize(
    ("roots", "wanted"),
    [
        (["zlib1g"], {"zlib1g", "libc6", "libgcc-s1", "gcc-12-base"}),
        (
            ["python3.11-minimal"],
            {"python3.11-minimal", "libpython3.11-minimal", "libc6", "libgcc-s1", "gcc-12-base",
             "libssl3", "zlib1g"},
        ),
        # dpkg (an install-time tool) and what only it needs are left out.
        (["libreadline8"], {"libreadline8", "readline-common", "libtinfo6", "libc6", "libgcc-s1",
                            "gcc-12-base"}),
        (["tzdata"], {"tzdata"}),
        # The first installed alternative; `:any` qualifiers dropped.
        (["libpython3.11-stdlib"], {"libpython3.11-stdlib", "media-types", "libreadline8",
                                    "readline-common", "libtinfo6", "libmpdec3", "libc6",
                                    "libgcc-s1", "gcc-12-base"}),
        # A virtual name resolves to the installed package providing it.
        (["needs-awk"], {"needs-awk", "mawk"}),
    ],
)  # fmt: skip
def test_the_image_gets_what_its_roots_need_to_run(roots: list[str], wanted: set[str]) -> None:
    installed = rootfs.parse_status(STATUS)
    assert "removed" not in installed
    assert rootfs.closure(installed, roots, skip=rootfs.INSTALL_ONLY) == wanted


def test_a_missing_package_is_named() -> None:
    installed = rootfs.parse_status(STATUS)
    with pytest.raises(KeyError, match="removed is not installed"):
        rootfs.closure(installed, ["removed"], skip=rootfs.INSTALL_ONLY)
    broken = rootfs.parse_status(stanza("a", depends="gone | also-gone"))
    with pytest.raises(KeyError, match=r"a needs one of gone \| also-gone"):
        rootfs.closure(broken, ["a"], skip=frozenset())


@pytest.mark.parametrize(
    ("path", "kept"),
    [
        ("/usr/lib/python3.11/os.py", True),
        ("/usr/share/doc/libc6/copyright", True),
        ("/usr/share/doc/libc6/changelog.Debian.gz", False),
        ("/usr/share/man/man1/python3.11.1.gz", False),
        ("/usr/share/locale/de/LC_MESSAGES/libc.mo", False),
    ],
)
def test_documentation_stays_out_but_licences_stay_in(path: str, kept: bool) -> None:
    assert rootfs.kept(path) is kept


def test_the_chart_values_take_the_comment_right_above_each_key() -> None:
    text = """# About a.
a:
  # About b,
  # on two lines.
  b: 1

  c: []
  # - name: example
  #   other: 2
  # About d.
  d: {}
    # deeper: not about e
  e: ""
"""
    assert chart_values.yaml_comments(text) == {
        "a": "About a.",
        "a.b": "About b, on two lines.",
        "a.d": "About d.",
    }
