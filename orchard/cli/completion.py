"""Tab completion of config groups, options and keys in bash and zsh (``-sc install=bash|zsh``).

Hydra's own completion script finds an app by its file (``python app.py``) and so never
completes ``python -m orchard``; orchard's script completes both ``orchard`` (the console script)
and ``python -m orchard``, and leaves every other ``python`` command line to the completion it
had.  What to offer is Hydra's: its bash completion plugin answers each query (``-sc query=bash``,
the line in ``COMP_LINE``) from orchard's config search path.  zsh runs the same script through
its ``bashcompinit``, as Hydra documents.
"""
from __future__ import annotations

import os
import shlex

SCRIPT = r"""# orchard's tab completion (python -m orchard -sc install=bash); remove with -sc uninstall=bash
_orchard_old_python=$(complete -p python 2>/dev/null | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
_orchard_completion()
{
    local words=($COMP_LINE) helper
    case "${words[0]##*/}" in
        python|python3|python3.*)
            if [ "${words[1]}" != "-m" ] || [ "${words[2]}" != "orchard" ]; then
                # another python command line: the completion python had before, if any
                [ -n "$_orchard_old_python" ] && "$_orchard_old_python" "$@"
                return
            fi
            helper="${words[0]} -m orchard" ;;
        *) helper="${words[0]}" ;;
    esac
    local line="${COMP_LINE:0:$COMP_POINT}"
    local word="${line##* }"
    local choices
    choices=$(COMP_LINE="$line" COMP_POINT="${#line}" $helper -sc query=bash 2>/dev/null)
    COMPREPLY=($(compgen -W "$choices" -- "$word"))
}
COMP_WORDBREAKS=${COMP_WORDBREAKS//=}
complete -o nospace -o default -F _orchard_completion orchard python python3
"""
ZSH_PREFIX = "autoload -Uz bashcompinit && bashcompinit\n"
UNINSTALL = r"""complete -r orchard python python3 2>/dev/null
[ -n "$_orchard_old_python" ] && complete -o default -F "$_orchard_old_python" python python3
unset -f _orchard_completion
unset _orchard_old_python
"""
# orchard's own flags, which Hydra's argument parser does not know
OWN_FLAGS = ("-v", "--verbose")


def script(verb: str, shell: str) -> str:
    """What ``-sc install=<shell>`` / ``uninstall=<shell>`` prints, for ``eval "$(...)"``."""
    if verb == "uninstall":
        return UNINSTALL
    return (ZSH_PREFIX if shell == "zsh" else "") + SCRIPT


def query() -> str:
    """The completions for the command line in ``COMP_LINE`` (up to the cursor), one line."""
    import contextlib
    import io

    from hydra.core.plugins import Plugins
    from hydra.plugins.completion_plugin import CompletionPlugin

    from orchard import config as config_lib
    from orchard.config import registry

    line = os.environ.get("COMP_LINE", "")
    try:
        words = _after_program(shlex.split(line))
    except ValueError:  # a quote not closed yet
        words = _after_program(line.split())
    new_word = not line or line.endswith(" ")
    args, current = (words, "") if new_word else (words[:-1], words[-1] if words else "")
    kept = []
    pairs = iter(args)
    for arg in pairs:  # --config-dir DIR adds its groups to what is offered
        if arg in ("--config-dir", "-cd"):
            folder = next(pairs, None)
            if folder and os.path.isdir(folder):
                registry.add_config_dir(os.path.abspath(folder))
        elif arg not in OWN_FLAGS:
            kept.append(arg)
    kept += config_lib.searchpath_override()
    plugin_class = next(p for p in Plugins.instance().discover(CompletionPlugin) if p.provides() == "bash")
    out = io.StringIO()
    with config_lib.hydra_context() as hydra, contextlib.redirect_stdout(out):
        os.environ["COMP_LINE"] = " ".join(["orchard", *kept, current])  # the form Hydra's plugin reads
        try:
            plugin_class(hydra.config_loader()).query(config_name="config")
        except Exception:  # a half-typed line Hydra cannot compose: offer nothing rather than a traceback
            return ""
    return out.getvalue().strip()


def _after_program(words: list[str]) -> list[str]:
    """The words after ``orchard`` or ``python -m orchard``."""
    if len(words) >= 3 and os.path.basename(words[0]).startswith("python") and words[1:3] == ["-m", "orchard"]:
        return words[3:]
    return words[1:]
