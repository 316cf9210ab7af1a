"""What a stage's calls can run in a course directory: a digest of that code, to tell when two subjects of
`stages check` run the same code for a stage (a mutant whose edit the stage never reaches).

Only the instructor's own subjects are read here (the solution and mutants built from it), never a
student's: the digest decides what `stages check` may reuse, not a grade. It is conservative, so a
digest equal to another's means the code the stage runs is the same:

- from the adapter functions the stage calls (tests/adapters.py), every top-level function and class
  their code names is followed, in the same module or through `from src.x import f` and `import
  src.x as m` (then `m.f`), with the defaults and decorators written with them;
- every module reached counts with all its top-level statements other than definitions (constants,
  imports, code run on import), and every `__init__.py` and every file that is not Python counts whole;
- a course whose Python does anything dynamic (getattr, globals, importlib, exec, ...) or imports other than
  at the top of a module by absolute name (a relative import, `import *`, an import inside a function), a module that
  does not parse, an adapters file that is not Python (the TypeScript edition), or a stage whose
  adapter is not found: the whole tree is the digest, so only byte-identical subjects are alike.
"""

import ast
import hashlib
import io
import os
from dataclasses import dataclass, field
from pathlib import Path

_DYNAMIC = frozenset(
    "getattr setattr delattr globals locals vars eval exec compile __import__ importlib import_module "
    "__dict__ __getattr__ sys modules reload runpy".split()
)
_SKIPPED_DIRS = {"__pycache__", "node_modules", ".git"}


@dataclass
class _Module:
    name: str  # dotted, as imported: src.gpt2 (tests/adapters.py is "adapters")
    defs: dict[str, ast.stmt] = field(default_factory=dict)  # top-level function or class name -> its node
    rest: list[str] = field(default_factory=list)  # the source of every other top-level statement
    names: dict[str, tuple[str, str]] = field(default_factory=dict)  # from-imported name -> (module, name)
    aliases: dict[str, str] = field(default_factory=dict)  # imported module's local name -> module
    text: str = ""
    lines: list[str] = field(default_factory=list)  # text.splitlines(), split once for every definition's source


class _Dynamic(Exception):
    """The code may reach what names alone do not say: only the whole tree is a safe digest."""


def _files(root: Path) -> list[Path]:
    found = []
    for top, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS)
        found += [Path(top) / n for n in sorted(names)]
    return found


def tree_digest(root: Path) -> str:
    """Every file's relative path and bytes."""
    h = hashlib.sha256()
    for path in _files(root):
        h.update(b"%s\0%s\0" % (path.relative_to(root).as_posix().encode(), path.read_bytes()))
    return "tree:" + h.hexdigest()


def _module_name(rel: Path) -> str:
    return "adapters" if rel.as_posix() == "tests/adapters.py" else ".".join(rel.with_suffix("").parts)


def _parse(name: str, text: str) -> _Module:
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and node.id in _DYNAMIC) or (
            isinstance(node, ast.Attribute) and node.attr in _DYNAMIC
        ):
            raise _Dynamic(name)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(a.name in _DYNAMIC for a in node.names):
            raise _Dynamic(name)
    # Only top-level, absolute, named imports are followed: a relative one, `import *` or one inside a function
    # binds names no rule here resolves.
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or any(a.name == "*" for a in node.names)):
            raise _Dynamic(f"{name}: from {'.' * node.level}{node.module or ''} import ...")
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node not in tree.body:
            raise _Dynamic(f"{name}: an import below the top level")
    module, ast_lines = _Module(name, text=text, lines=text.splitlines()), _ast_lines(text)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            module.defs[node.name] = node
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for a in node.names:
                module.names[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                module.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        module.rest.append(_segment(ast_lines, node) or ast.dump(node))
    return module


def _ast_lines(text: str) -> list[str]:
    """text's lines as ast numbers them (split at \\n, \\r\\n and \\r only), their ends kept."""
    return io.StringIO(text, newline="").readlines()


def _segment(lines: list[str], node: ast.stmt) -> str | None:
    """ast.get_source_segment(text, node) from text's lines split once (it splits the whole text on every call)."""
    if node.end_lineno is None or node.end_col_offset is None:
        return None
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset : node.end_col_offset].decode()
    head = lines[first].encode()[node.col_offset :].decode()
    return "".join([head, *lines[first + 1 : last], lines[last].encode()[: node.end_col_offset].decode()])


def _source(module: _Module, node: ast.stmt) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(module.lines[first - 1 : node.end_lineno])


def _walk(modules: dict[str, _Module], roots: list[tuple[str, str]]) -> list[str]:
    """The sources reached from roots ((module, name) pairs), each module's other statements with them."""
    seen: set[tuple[str, str]] = set()
    reached: set[str] = set()
    todo = list(roots)
    while todo:
        module_name, name = todo.pop()
        module = modules.get(module_name)
        if module is None:
            continue  # numpy, theinference, the standard library: not the course's code
        if module_name not in reached:  # what its own statements name runs on import, or is reached through them
            reached.add(module_name)
            todo += _named(modules, module, (n for text in module.rest for n in ast.walk(ast.parse(text))))
        if name not in module.defs:
            if name in module.names:
                todo.append(module.names[name])  # a name imported into this module
            continue
        if (module_name, name) not in seen:
            seen.add((module_name, name))
            todo += _named(modules, module, ast.walk(module.defs[name]))
    found = [f"module {m}\n" + "\n".join(modules[m].rest) for m in sorted(reached)]
    found += [f"def {m}.{n}\n{_source(modules[m], modules[m].defs[n])}" for m, n in sorted(seen)]
    return found


def _named(modules: dict[str, "_Module"], module: _Module, nodes) -> list[tuple[str, str]]:
    """The (module, name) pairs the nodes name: a bare name in this module, or m.name of an imported course module."""
    nodes = list(nodes)
    out, through = [], set()
    for node in nodes:
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in module.aliases:
            target = module.aliases[node.value.id]
            if f"{target}.{node.attr}" in modules:  # a submodule reached as an attribute: followed by no rule here
                raise _Dynamic(f"{module.name}: {node.value.id}.{node.attr}")
            out.append((target, node.attr))
            through.add(id(node.value))
    for node in nodes:
        if isinstance(node, ast.Name) and id(node) not in through:
            if node.id in module.aliases and module.aliases[node.id] in modules:
                raise _Dynamic(f"{module.name}: module {node.id} used other than as m.name")
            out.append((module.name, node.id))
    return out


def stage_digest(root: Path, adapter_names: tuple[str, ...]) -> str:
    """The digest of the code the named adapter functions can run in the course at root (see the module)."""
    modules: dict[str, _Module] = {}
    others = []
    try:
        for path in _files(root):
            rel = path.relative_to(root)
            if path.suffix != ".py":
                others.append(f"file {rel.as_posix()}\n{path.read_bytes().hex()}")
                continue
            text = path.read_text(encoding="utf-8")
            if path.name == "__init__.py":
                others.append(f"file {rel.as_posix()}\n{text}")
            modules[_module_name(rel)] = _parse(_module_name(rel), text)
        for module in modules.values():  # `from src import gpt2`: gpt2 is a module, used as one
            for local, (source, name) in module.names.items():
                if f"{source}.{name}" in modules:
                    module.aliases[local] = f"{source}.{name}"
        adapters = modules.get("adapters")
        names = [n for n in adapter_names if adapters is not None and n in adapters.defs]
        if not names:
            return tree_digest(root)
        reached = _walk(modules, [("adapters", n) for n in names])
    except (_Dynamic, SyntaxError, UnicodeDecodeError, ValueError, RecursionError):
        return tree_digest(root)
    h = hashlib.sha256()
    for part in [*sorted(others), *reached, "adapters " + " ".join(names)]:
        h.update(part.encode() + b"\0")
    return "code:" + h.hexdigest()
