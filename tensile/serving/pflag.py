"""The command-line forms of Go's pflag (spf13/pflag), which tensile-kube's and
virtual-kubelet's programs were parsed with, rewritten into the one form argparse reads.

`normalize` is pure: argv in, argv out. `flags.Parser` applies it to every command line, so
every flag any command defines (now or later) takes these forms:

- `--name=value` and `--name value` for flags with a value, whatever the value looks like
  (pflag takes `--taint -x` as a value; argparse would not);
- booleans as `--name`, `--name=true`, `--name=false` (pflag's `NoOptDefVal`: a bare
  boolean is true, and its value is only ever attached with `=`);
- `_` as well as `-` between words (component-base's `WordSepNormalizeFunc`:
  `--log_dir` is `--log-dir`);
- klog's flags under node-cli's `klog.` prefix (`--klog.v=5` is `--v=5`) and with one dash
  (`-v=3`: Go's flag package, which klog registers with);
- `version` as a subcommand (cobra's, in tensile-kube's descheduler and node-cli) and
  `--version`: `wants_version` tells.

Nothing after a lone `--` is touched.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

KLOG_PREFIX = "klog."
"""node-cli registers klog's flags under this prefix (`--klog.v`)."""
VERSION_COMMAND = "version"
_GO_BOOLEANS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}
"""The words Go's strconv.ParseBool takes (pflag's booleans), exactly as written here."""


def parse_bool(text: str) -> bool:
    """Return the boolean `text` stands for as Go's strconv.ParseBool reads it: 1 t T TRUE
    true True, 0 f F FALSE false False, and nothing else (no other case, no spaces, no
    yes/no). Raises ValueError for anything else."""
    try:
        return _GO_BOOLEANS[text]
    except KeyError:
        raise ValueError(f"not a boolean: {text!r} (true or false)") from None


def canonical_name(name: str, *, known: Collection[str]) -> str:
    """Return the option string `--name` stands for: `name` itself when known, else with
    the `klog.` prefix dropped and `_` written `-`, when that is known; else `name` unchanged
    (argparse then reports it as it was typed). `name` includes its dashes."""
    if name in known:
        return name
    bare = name.lstrip("-")
    if bare.startswith(KLOG_PREFIX):
        bare = bare[len(KLOG_PREFIX) :]
    candidate = "--" + bare.replace("_", "-")
    return candidate if candidate in known else name


def normalize(
    argv: Sequence[str], *, valued: Collection[str], booleans: Collection[str]
) -> list[str]:
    """Return `argv` with every known flag as `--name=value` (`--name=true` for a bare
    boolean). `valued` are the option strings that take one value, `booleans` those that
    take pflag's optional boolean; other tokens pass unchanged (argparse judges them).

    A valued flag last on the line without its value stays as it is (argparse then says
    it "expected one argument")."""
    known = {*valued, *booleans}
    result: list[str] = []
    tokens = list(argv)
    index = 0
    while index < len(tokens):
        word = tokens[index]
        index += 1
        if word == "--":
            result.extend(tokens[index - 1 :])
            break
        if not word.startswith("-") or word == "-":
            result.append(word)
            continue
        name, sep, value = word.partition("=")
        if name.startswith("--"):
            name = canonical_name(name, known=known)
        else:
            # Go's flag package: one dash is as good as two (`-v=3`, `-logtostderr`); pflag
            # met it only through the klog flags it adopted, so one dash stays a short
            # option unless a long flag of that name exists.
            long = canonical_name("-" + name, known=known)
            name = long if long in known else name
        if name in booleans:
            result.append(f"{name}={value if sep else 'true'}")
        elif name in valued and not sep and index < len(tokens):
            result.append(f"{name}={tokens[index]}")
            index += 1
        else:
            result.append(f"{name}{sep}{value}")
    return result


def wants_version(argv: Sequence[str]) -> bool:
    """Whether a NORMALIZED command line asks for the version: `version` as its first word
    that is no flag (cobra's subcommand; after normalizing, a flag's value is attached to
    it) or `--version` (true)."""
    for word in argv:
        if word == "--":
            return False
        if not word.startswith("-"):
            return word == VERSION_COMMAND
        name, _, value = word.partition("=")
        if name == "--version":
            # Anything but a true word is no request: argparse refuses a word that is not a
            # boolean with the flag named.
            return _GO_BOOLEANS.get(value, False)
    return False
