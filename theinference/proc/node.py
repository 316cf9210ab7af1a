"""The TypeScript edition's worker: Node.js running proc/harness.mjs, which speaks proc/protocol.py as child.py does.

A course whose adapters are `tests/adapters.ts` (or `.js`, `.mjs`, ...) is run by Node instead of Python. For
TypeScript, what the course itself provides is used, in this order: the `tsx` package of the nearest
`node_modules` at or above the course root (loaded into the harness's own process with `--import`), then Node's
own type stripping where this Node version has it; otherwise the run is a setup error (exit 2) naming the command
that installs tsx. Node cannot run under the address-space cap Python's worker sets itself (V8 and WebAssembly
reserve far more than they use), so memory is capped as the V8 heap size, and the file-size cap is set by
`prlimit` before Node starts.
"""

import functools
import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from theinference.errors import ConfigError
from theinference.proc import protocol

HARNESS = Path(__file__).resolve().parent / "harness.mjs"
NODE_SUFFIXES = (".ts", ".mts", ".cts", ".js", ".mjs", ".cjs")
TYPESCRIPT_SUFFIXES = (".ts", ".mts", ".cts")
INSTALL_TSX = "npm install --save-dev tsx"


class NodeMissing(ConfigError):
    """The course's adapters need Node.js (or a TypeScript runner) that this machine lacks: a setup error."""


def is_node_adapters(path: str | Path) -> bool:
    """Whether these adapters are the TypeScript (or JavaScript) edition's, run by Node."""
    return Path(path).suffix in NODE_SUFFIXES


@dataclass(frozen=True)
class NodeWorker:
    """How to start the harness for one course: the command before the harness's path, and what it must read."""

    prefix: tuple[str, ...]  # node and its flags (and the prlimit in front)
    readable: tuple[str, ...]  # directories outside the course the sandbox must show: Node's install, tsx's package


@functools.cache
def node_executable() -> str | None:
    """The `node` on PATH, resolved (None if Node.js is not installed)."""
    found = shutil.which("node")
    return str(Path(found).resolve()) if found else None


@functools.cache
def type_stripping(node: str) -> tuple[str, ...] | None:
    """The flags with which this Node runs .ts files by itself (none from 23.6, where it is on by default), or None
    where it cannot (before 22.6)."""
    probe = (
        "JSON.stringify([Boolean(process.features.typescript), "
        "process.allowedNodeEnvironmentFlags.has('--experimental-strip-types')])"
    )
    try:
        done = subprocess.run([node, "-p", probe], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        on_by_default, has_flag = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError, TypeError):
        return None
    if on_by_default:
        return ("--disable-warning=ExperimentalWarning",)
    if has_flag:
        return ("--experimental-strip-types", "--disable-warning=ExperimentalWarning")
    return None


def strips_types(node: str) -> bool:
    """Whether this Node runs .ts files by itself (type stripping: Node 22.6 and later)."""
    return type_stripping(node) is not None


def find_tsx(course_root: Path) -> Path | None:
    """The loader of the tsx package in the nearest node_modules at or above course_root (as npx looks)."""
    for directory in (course_root, *course_root.parents):
        package = directory / "node_modules" / "tsx"
        if (package / "package.json").is_file() and (directory / "node_modules" / ".bin" / "tsx").exists():
            loader = package.resolve() / "dist" / "loader.mjs"
            if loader.is_file():
                return loader
    return None


def _node_prefix(node: str) -> str:
    """The installation Node runs from (its bin's parent), to show inside the sandbox."""
    return str(Path(node).parent.parent)


def worker(adapters: Path, course_root: Path, limits: protocol.Limits) -> NodeWorker:
    """The command (without the harness and job) that runs these adapters; NodeMissing if it cannot."""
    node = node_executable()
    if node is None:
        raise NodeMissing(
            f"{adapters.name} is the TypeScript edition's adapters file, which runs on Node.js: "
            "node is not on PATH (install Node.js 20 or later, e.g. from https://nodejs.org or your package manager)"
        )
    flags: list[str] = []
    readable = [_node_prefix(node)]
    if adapters.suffix in TYPESCRIPT_SUFFIXES:
        tsx = find_tsx(course_root)
        if tsx is not None:
            flags += ["--import", tsx.as_uri()]
            readable.append(str(tsx.parent.parent.parent))  # node_modules, which holds tsx and esbuild
        elif (stripping := type_stripping(node)) is not None:
            flags += stripping
        else:
            raise NodeMissing(
                f"{adapters.name} is TypeScript, and neither the course provides tsx (node_modules/.bin/tsx) "
                f"nor does this Node.js strip types by itself (Node 22.6 or later): run `{INSTALL_TSX}` "
                f"in {course_root}"
            )
    flags.append("--enable-source-maps")
    if limits["memory_bytes"]:
        flags.append(f"--max-old-space-size={max(limits['memory_bytes'] >> 20, 64)}")
    capped: list[str] = []
    prlimit = shutil.which("prlimit")
    if limits["file_bytes"] and prlimit:
        capped = [prlimit, f"--fsize={limits['file_bytes']}:{limits['file_bytes']}", "--"]
    return NodeWorker(prefix=(*capped, node, *flags), readable=tuple(readable))


def worker_for_job(job_file: str) -> NodeWorker | None:
    """The Node worker a job file's adapters need, or None when they are Python (child.py runs them)."""
    job: protocol.Job = json.loads(Path(job_file).read_text())
    if not is_node_adapters(job["adapters"]):
        return None
    return worker(Path(job["adapters"]), Path(job["course_root"]), job["limits"])
