"""pip's settings as uv's, inside an image build: ``python pip_to_uv.py PIP_CONF`` prints a shell snippet
for ``eval`` that sets the positional arguments (``set -- ...``) to the ``uv pip install`` options
saying what the pip.conf says, and exports what uv takes only from the environment.

A flavour with ``uv`` set (containers/cpu) installs its dependency layer with uv rather than pip (7.7
instead of 21.9 CPU-s and 5 s instead of 22 s for the cpu image's ~57 packages here). The build has
one source of package settings, the ``pipconf`` secret (:mod:`.pipsettings`), which uv does not read:
this translates it, with the index strategy pip has (the best version across every index, not the
first index that has the name). The Dockerfile bind-mounts this file from the build context and runs
it with the base image's Python, before lmforge is installed: standard library only, no lmforge import.

No file, an empty one or no ``[global]`` section: pip's index strategy and nothing else (uv's defaults
otherwise, as pip's without a pip.conf).
"""

from __future__ import annotations

import configparser
import shlex
import sys

#: pip.conf keys of ``[global]`` (or ``[install]``) -> the uv option, each value split on white space
_LIST_OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "trusted-host": "--allow-insecure-host",
}
_TIMEOUT_KEYS = ("timeout", "default-timeout")
_TRUE = {"1", "true", "yes", "on"}


def uv_settings(text: str) -> tuple[list[str], dict[str, str]]:
    """(``uv pip install`` options, environment) for the pip.conf ``text``."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    merged: dict[str, str] = {}
    for section in ("global", "install"):  # pip reads both; the command's section wins
        if parser.has_section(section):
            merged.update(parser.items(section))
    args = ["--index-strategy", "unsafe-best-match"]
    if merged.get("no-index", "").strip().lower() in _TRUE:
        args.append("--no-index")
    for key, option in _LIST_OPTIONS.items():
        for value in merged.get(key, "").split():
            args += [option, value]
    env = {}
    for key in _TIMEOUT_KEYS:
        if merged.get(key, "").strip():
            env["UV_HTTP_TIMEOUT"] = merged[key].strip()
    return args, env


def shell(args: list[str], env: dict[str, str]) -> str:
    lines = [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    lines.append("set -- " + " ".join(shlex.quote(a) for a in args))
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    text = ""
    if len(argv) == 2:
        try:
            with open(argv[1], encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            pass
    elif len(argv) != 1:
        print("usage: pip_to_uv.py [PIP_CONF]", file=sys.stderr)
        return 2
    try:
        args, env = uv_settings(text)
    except configparser.Error as exc:
        print(f"pip_to_uv.py: {argv[1]} is not a pip.conf: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(shell(args, env))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
