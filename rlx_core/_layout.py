"""The core's layout, printed and checked: ``python -m rlx_core._layout``.

The tree is the architecture: each package of ``rlx_core`` is one concern, and the
concerns are stacked in ``LAYERS``, top to bottom. A module may import its own layer and
the layers below it, never one above, so that (for example) the IR never learns about
devices and a backend's discovery never depends on how sessions run. Two rules are
checked here on the source, without importing it (this file uses the standard library
only, so ``nox -s lint`` runs it as a script in a venv that has none of rlx's
dependencies):

- every module and package directly under ``rlx_core`` falls under one layer, and no
  import (a module's top level or a function's lazy one, ``TYPE_CHECKING`` blocks
  excepted) reaches a layer above its own;
- no module outside ``rlx_core/ir/`` uses private state of ``Graph`` (``g._nodes``):
  passes, runners and backends edit graphs through the public API, so the graph's
  representation can change without breaking them. A class reaching its own state
  through a bare ``self``/``cls`` is the one exception.

``LAYERS`` is the table of import-linter's ``rlx_core's layers`` contract in
``pyproject.toml``; a test checks the two agree. Exit status 1 names every violation.
"""

from __future__ import annotations

import ast
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path

#: Top to bottom; the names of one layer may import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__", "cli"),
    ("distributed",),
    ("onnx",),
    ("run",),
    ("placement",),
    ("compiler", "testing"),
    ("backends",),
    ("plugin", "buckets"),
    ("calibration",),
    ("cost", "passes", "examples"),
    ("reference",),
    ("ir",),
    ("cache", "options", "timer", "_layout", "_moved", "_version", "errors"),
)

PACKAGE = Path(__file__).resolve().parent
#: First-party backends scanned for private Graph state when they sit beside the core.
BACKENDS = ("rlx_cpu", "rlx_opencl", "rlx_cuda", "rlx_jax_tpu")


def layer_of(name: str) -> int | None:
    """The index in ``LAYERS`` of ``rlx_core``'s child ``name`` (``None``: unplaced)."""
    for i, layer in enumerate(LAYERS):
        if name in layer:
            return i
    return None


def children(package: Path = PACKAGE) -> list[str]:
    """The modules and packages directly under ``package``, as import names."""
    names = [p.stem for p in package.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(names)


def _module_name(path: Path, package: Path) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, package: Path) -> Iterable[tuple[int, str]]:
    """(line, absolute module) for each import in ``path``, ``TYPE_CHECKING`` blocks skipped."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    here = _module_name(path, package).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for child in node.body for n in ast.walk(child)}
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            if node.module:
                yield node.lineno, module
            else:  # ``from .. import errors``: each name may be a module
                yield from ((node.lineno, f"{module}.{alias.name}") for alias in node.names)


def layer_violations(package: Path = PACKAGE) -> list[str]:
    """Unplaced children of the package, and imports that reach a layer above their own."""
    root = package.name
    found = [f"{root}.{name}: in no layer of rlx_core._layout.LAYERS" for name in children(package)
             if layer_of(name) is None]
    for path in sorted(package.rglob("*.py")):
        source = _module_name(path, package)
        own = source.split(".")[1] if "." in source else None
        if own is None or layer_of(own) is None:
            continue
        for line, target in _imports(path, package):
            parts = target.split(".")
            if parts[0] != root or len(parts) < 2 or parts[1] == own:
                continue
            theirs = layer_of(parts[1])
            if theirs is not None and theirs < layer_of(own):
                found.append(f"{path.relative_to(package.parent)}:{line}: {source} ({own}, layer "
                             f"{layer_of(own)}) imports {target} ({parts[1]}, layer {theirs}, above it)")
    return found


def graph_private_names(package: Path = PACKAGE) -> set[str]:
    """The private names of ``Graph`` read from ``ir/graph.py``: its ``_methods``, its
    class-level ``_names`` and the ``self._state`` its methods assign."""
    tree = ast.parse((package / "ir" / "graph.py").read_text(encoding="utf-8"))
    graph = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Graph")
    names: set[str] = set()
    for node in ast.walk(graph):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            if isinstance(node.ctx, ast.Store):
                names.add(node.attr)
        elif isinstance(node, ast.AnnAssign | ast.Assign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}


def private_uses(path: Path, private: set[str], relative_to: Path) -> list[str]:
    """``owner._name`` uses in ``path`` where ``_name`` is in ``private`` and ``owner`` is
    not a bare ``self``/``cls``. Read with ``tokenize``: it needs no AST, so it runs in a
    process whose AST state earlier work disturbed (seen in CPython 3.11 test workers)."""
    with path.open("rb") as f:
        toks = [t for t in tokenize.tokenize(f.readline) if t.type not in _SKIP]
    found = []
    for i in range(1, len(toks) - 1):
        dot, name, owner = toks[i], toks[i + 1], toks[i - 1]
        if not (dot.type == tokenize.OP and dot.string == "." and name.type == tokenize.NAME):
            continue
        if name.string not in private:
            continue
        bare = i < 2 or not (toks[i - 2].type == tokenize.OP and toks[i - 2].string == ".")
        if owner.type == tokenize.NAME and owner.string in ("self", "cls") and bare:
            continue
        found.append(f"{path.relative_to(relative_to)}:{name.start[0]}: {owner.string}.{name.string}")
    return found


def graph_sources(package: Path = PACKAGE) -> list[Path]:
    """Every module outside ``ir/``, and the first-party backends found beside the core
    (a checkout's ``plugins/*/rlx_*``, or installed next to it)."""
    paths = [p for p in package.rglob("*.py") if (package / "ir") not in p.parents]
    checkout = package.parent / "plugins"
    roots = [d for d in checkout.glob("*/rlx_*") if d.is_dir()] if checkout.is_dir() else []
    roots += [package.parent / name for name in BACKENDS if (package.parent / name).is_dir()]
    for root in roots:
        paths += root.rglob("*.py")
    return sorted(set(paths))


def private_violations(package: Path = PACKAGE) -> list[str]:
    private = graph_private_names(package)
    return [hit for path in graph_sources(package) for hit in private_uses(path, private, package.parent)]


def describe(package: Path = PACKAGE) -> str:
    """Each layer, top to bottom, with its packages' modules and their first docstring line."""
    lines = []
    for i, layer in enumerate(LAYERS):
        lines.append(f"layer {i}: {' : '.join(layer)}")
        for name in layer:
            target = package / name
            if target.is_dir():
                lines.append(f"  {name}/  {_first_line(target / '__init__.py')}")
                for module in sorted(target.glob("*.py")):
                    if module.stem != "__init__":
                        lines.append(f"    {module.stem:<18} {_first_line(module)}")
            elif (package / f"{name}.py").exists():
                lines.append(f"  {name + '.py':<20} {_first_line(package / f'{name}.py')}")
    return "\n".join(lines)


def _first_line(path: Path) -> str:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    except (OSError, SyntaxError):
        return ""
    first = doc.strip().split("\n", 1)[0]
    return first if len(first) <= 90 else first[:87] + "..."


def main(argv: list[str] | None = None) -> int:
    """Print the layout (unless ``--check``), then check both rules; 1 on a violation."""
    args = sys.argv[1:] if argv is None else argv
    if "--check" not in args:
        print(describe())
    problems = layer_violations() + [f"{hit}: private Graph state outside rlx_core.ir (use the edit API)"
                                     for hit in private_violations()]
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"layout ok: {len(LAYERS)} layers, {len(children())} packages and modules, no import above its layer, "
              "no private Graph state outside ir/")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
