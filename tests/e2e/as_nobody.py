"""Run the grader as user nobody (not root, no capabilities), the weakest confinement a laptop or CI gets.

This Python (its venv, its base install, the installed package) may sit under a directory that nobody
cannot enter, such as a private /root. Then the command runs in a private mount namespace in which that
directory is a world-traversable tmpfs with only the needed subtrees bound back in: every path stays the
same (a venv's links and pyvenv.cfg are absolute), nothing else of it becomes visible, and nothing on the
machine changes. The grader inside cannot tell: its PATH holds only the venv's bin, so it finds neither
bwrap nor unshare and confines by its subreaper monitor alone.
"""

import os
import shlex
import shutil
import sys
from pathlib import Path

import theinference
from theinference.proc.sandbox import NOBODY

_NEEDED = (Path(sys.executable), Path(sys.executable).resolve(), Path(sys.prefix), Path(sys.base_prefix))


def _closed(path: Path) -> list[Path]:
    """The directories on the way to path (path included) that others cannot enter, outermost first."""
    return [p for p in reversed([path, *path.parents]) if p.is_dir() and not os.stat(p).st_mode & 0o001]


def _needed() -> list[Path]:
    return [p.absolute() for p in (*_NEEDED, Path(theinference.__file__).resolve().parent)]


def _openings() -> dict[Path, set[str]]:
    """Closed directory -> the entries of it the grader needs."""
    found: dict[Path, set[str]] = {}
    for path in _needed():
        closed = _closed(path)
        if closed:
            found.setdefault(closed[0], set()).add(path.relative_to(closed[0]).parts[0])
    return found


def available() -> str:
    """Why nothing can run as nobody here ('' when it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:  # Windows has no uids
        return "needs root (to become user nobody)"
    missing = [tool for tool in ("setpriv", "unshare", "mount") if shutil.which(tool) is None]
    if missing:
        return f"needs {', '.join(missing)}"
    if any(len(_closed(path)) > 1 or path in _closed(path) for path in _needed()):
        return "this Python sits under nested private directories, or in one"
    return ""


def command(argv: list[str], env: dict[str, str], as_nobody_too: bool = True, uid: int = NOBODY) -> list[str]:
    """argv with exactly env, as user nobody or another uid of no account (as_nobody_too, else as root: student
    code then runs as a uid the grader leases), this Python made reachable for every other user.

    Run it as the uid conftest.leased_uid() holds: a root grader in a test beside it would otherwise lease that uid
    for its students and, after their run, kill every process of it, this grader among them."""
    who = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if as_nobody_too else []
    as_nobody = [*who, "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv]
    openings = _openings()
    if not openings:
        return as_nobody
    script = ["set -e"]
    for closed, entries in openings.items():
        hidden = shlex.quote(str(closed))
        script += [
            "saved=$(mktemp -d)",
            f'mount --bind {hidden} "$saved"',
            f"mount -t tmpfs -o mode=0755 tmpfs {hidden}",
        ]
        for entry in sorted(entries):
            inside = shlex.quote(str(closed / entry))
            script += [f"mkdir -p {inside}", f'mount --bind "$saved"/{shlex.quote(entry)} {inside}']
        script += ['umount "$saved"', 'rmdir "$saved"']  # the entries stay bound; nothing is left in /tmp
    script.append("exec " + shlex.join(as_nobody))
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)]
