"""Shell text built from what a user or a profile wrote: the one place scripts are quoted.

Every script jupyter-dlc generates (the Slurm batch script and its `#SBATCH` lines, a warm
pool's batch script, an export's `run.sh` and `job.sbatch`, Kubernetes pod commands, ssh
command lines, the node reporter's start) makes its words here, so that no value a user or
a profile wrote reaches a shell unquoted:

- `word` / `command`: a value (or an argv) as shell words. Parts the script itself must
  expand (`"$node"`, `"$HERE"`) are marked with `slot(NAME)`, a NUL-delimited marker that no
  user value can hold (specs refuse NUL bytes), so a user's `@NODE@` stays text;
- `export` / `export_default`: a variable set to a value, or to a default that a value
  already in the environment overrides (no `"${K-value}"`: a `}` or a quote in the value
  would end the expansion early);
- `directive`: an `#SBATCH` option. sbatch reads `#SBATCH` lines until the first line that
  is not a comment, so a newline in a value would end the directives and run the rest as
  shell on the node: control characters are refused (`UnsafeValue`, one line naming the
  field and the fix); spaces, quotes, `\\` and `#` are double-quoted as sbatch's own parser
  reads them (a bare `#` starts a comment there);
- `host_error`: why a host name cannot be given to ssh (a leading `-` is read as an option).

Imports nothing of ours: the engines, the export and the profile checks all use it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SBATCH_PLAIN = re.compile(r"[^\s\"'\\#]*")
_SLOT = "\0"


class UnsafeValue(ValueError):
    """One line: `field: what is wrong; how to fix it`."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


def control_char(value: str) -> str | None:
    """The first control character in `value` (newline, tab, escape...), shown, or None."""
    match = _CONTROL.search(value)
    return repr(match.group())[1:-1] if match else None


def refuse_control(value: str, field: str, fix: str) -> str:
    char = control_char(value)
    if char:
        raise UnsafeValue(field, f"contains a control character ({char}), which would end "
                                 f"the line it is written on; {fix}")
    return value


def quote(value: str) -> str:
    """One shell word that is exactly `value`, whatever it holds."""
    return shlex.quote(str(value))


def slot(name: str) -> str:
    """A marker for a part the script expands itself; `word` puts in the shell text given for it."""
    return f"{_SLOT}{name}{_SLOT}"


def word(value: str, slots: Mapping[str, str] | None = None) -> str:
    """`value` as one shell word: its text quoted, each `slot(NAME)` replaced by `slots[NAME]`
    (shell text such as '"$node"', written as it is)."""
    value = str(value)
    if _SLOT not in value:
        return quote(value)
    pieces = value.split(_SLOT)
    if len(pieces) % 2 == 0:
        raise ValueError(f"unbalanced slot in {value!r}")
    out = []
    for index, piece in enumerate(pieces):
        if index % 2:
            out.append((slots or {})[piece])
        elif piece:
            out.append(quote(piece))
    return "".join(out) or "''"


def command(argv: Iterable[str], slots: Mapping[str, str] | None = None) -> str:
    """A command line whose words are exactly `argv` (slots as in `word`)."""
    return " ".join(word(arg, slots) for arg in argv)


def var(name: str) -> str:
    """A variable's value as one word."""
    return f'"${_name(name)}"'


def _name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a shell variable name")
    return name


def export(name: str, value: str) -> str:
    return f"export {_name(name)}={quote(value)}"


def export_default(name: str, value: str | None = None, shell_word: str | None = None,
                   empty_wins: bool = True, exported: bool = True) -> str:
    """Set (and export) `name` to `value`, or to the shell text `shell_word`, unless the
    environment already sets it (even to empty, unless not `empty_wins`)."""
    given = f"${{{_name(name)}+set}}" if empty_wins else f"${{{name}:-}}"
    default = shell_word if shell_word is not None else quote(value or "")
    return f'[ -n "{given}" ] || {name}={default}' + (f"; export {name}" if exported else "")


def directive(option: str, value: str, field: str) -> str:
    """`--option=value` for an `#SBATCH` line; a value with a control character is refused."""
    refuse_control(str(value), field, f"give {field} on one line, without control characters")
    return f"--{option}={sbatch_quote(str(value))}"


def sbatch_line(item: str, field: str) -> str:
    """A whole option (a profile's `sbatch_args` item) for an `#SBATCH` line."""
    refuse_control(item, field, f"give each item of {field} on one line, without control characters")
    return sbatch_quote(item)


def sbatch_quote(value: str) -> str:
    """`value` as sbatch reads one `#SBATCH` argument: bare when it has no space, quote, `\\`
    or `#`, else in double quotes with `\\` and `"` escaped (checked against sbatch 22.05)."""
    if _SBATCH_PLAIN.fullmatch(value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def host_error(host: str) -> str | None:
    """Why `host` cannot be an ssh destination, or None: ssh reads a leading `-` as an
    option (`-oProxyCommand=...` runs a command), and blanks or control characters make
    no host name."""
    if not host:
        return "is empty"
    if host.startswith("-"):
        return f"{host!r} starts with '-', which ssh would read as an option"
    if _CONTROL.search(host) or any(c.isspace() for c in host):
        return f"{host!r} holds a space or a control character, which no host name has"
    return None
