"""The rules of the house (shared/STYLE.md), kept by tests over the import graph read with ``ast``: no module
is imported to check them, so a module that fails to import still gets its verdict.

- no import cycles among jaxlab modules (every import counts: top level or inside a function);
- the engine imports nothing from ``lab``, ``bench`` or the faces (``cli``, ``colab``, ``serve``);
- every room imports only the rooms below it (:data:`ROOMS`): ``io`` (configuration, files, the tokenizer) is the
  ground floor and imports no engine module, the engine measures nothing (no ``tools``), ``bench`` imports no
  ``lab`` (the notebooks' helpers read the bench, never the reverse);
- no private name (``_x``) is used outside its module: not imported (``from m import _x``), not read as an
  attribute of an imported module (``quant._unpack``), not patched by name (``setattr(m, "_x", ...)``);
- no module under jaxlab/ is longer than 800 lines;
- the test folders mirror the package.

Each checker is a plain function of a folder, tested below on small synthetic trees so that every rule is shown
able to fail; the rule tests then run the checkers on the repository and list every offender.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "jaxlab"
ENGINE = "jaxlab.engine"
ABOVE_ENGINE = (
    "jaxlab.lab",
    "jaxlab.bench",
    "jaxlab.cli",
    "jaxlab.colab",
    "jaxlab.serve",
    "jaxlab.retrieval",
    "jaxlab.train",
    "jaxlab.distributed",
)
#: What each room (a package or a top-level module of jaxlab) may import besides itself. "jaxlab" is the package's
#: __init__. quant and the engine meet at the linear layer's hook, so each may import the other.
FACES = ("cli", "colab", "serve", "distributed")
ROOMS: dict[str, set[str]] = {
    "errors": set(),
    "io": {"errors"},
    "quant": {"errors", "io", "engine"},
    "engine": {"errors", "io", "quant"},
    # the package root re-exports the engine's names, and first keeps jax off a TPU that libtpu alone cannot find
    "jaxlab": {"errors", "io", "engine", "tools"},
    "tools": {"errors", "io", "engine", "quant"},
    "retrieval": {"errors", "io", "engine", "tools"},
    "train": {"errors", "io", "engine", "quant", "tools"},
    "bench": {"errors", "io", "engine", "quant", "tools", "retrieval", "train", "jaxlab"},
    "lab": {"errors", "io", "engine", "quant", "tools", "retrieval", "train", "jaxlab", "bench"},
    "colab": set(),  # standard library only: it runs before jaxlab's dependencies are installed
    "serve": {"errors", "io", "engine", "quant", "tools"},
    "distributed": {"errors", "io", "engine", "tools"},
    "cli": {"errors", "io", "engine", "quant", "tools", "retrieval", "train", "bench", "lab", "serve", "jaxlab"},
}
MAX_LINES = 800
# Where Python lives in this repository: the package, its tests, the scripts, the benchmark scripts and the
# notebooks' committed text sources (with the exercises' solutions they load).
SOURCES = ("jaxlab", "tests", "scripts", "benchmarks", "notebooks/src", "notebooks/solutions")
TESTS_NOT_MIRRORED = {"house", "colab"}  # the rules of the house; data for the Colab simulation


@dataclass(frozen=True)
class Edge:
    src: str  # importing module, e.g. "jaxlab.engine.generate"
    dst: str  # imported jaxlab module, e.g. "jaxlab.engine.model"
    where: str  # "jaxlab/engine/generate.py:12"


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


# --- reading the package ---------------------------------------------------------------------------------


def modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under root/package (a package is its __init__.py)."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    """The longest prefix of a dotted name that is a known module."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in known:
            return candidate
    return None


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against the importing module)."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def imported(tree: ast.AST, module: str, is_package: bool, known: set[str]):
    """(jaxlab module, line) for every import in the tree that names one; ``from p import m`` names p.m when m is a
    module, p otherwise."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if (dst := _resolve(alias.name, known)) is not None:
                    yield dst, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                dst = full if full in known else _resolve(base, known)
                if dst is not None:
                    yield dst, node.lineno


def import_edges(root: Path, package: str = PACKAGE) -> list[Edge]:
    mods = modules(root, package)
    known = set(mods)
    edges = set()
    for name, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(root).as_posix()
        for dst, line in imported(tree, name, path.name == "__init__.py", known):
            if dst != name:
                edges.add(Edge(name, dst, f"{rel}:{line}"))
    return sorted(edges, key=lambda e: (e.src, e.dst, e.where))


# --- a. cycles ---------------------------------------------------------------------------------------------


def cycles(edges: list[Edge]) -> list[list[Edge]]:
    """One shortest cycle through each strongly connected group of modules (Tarjan, then a breadth-first search
    from the group's first module back to itself)."""
    graph: dict[str, list[Edge]] = {}
    for e in edges:
        graph.setdefault(e.src, []).append(e)
        graph.setdefault(e.dst, [])
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(v):  # recursive Tarjan; the package's graph is a few dozen modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph[v]:
            if e.dst not in index:
                connect(e.dst)
                low[v] = min(low[v], low[e.dst])
            elif e.dst in on_stack:
                low[v] = min(low[v], index[e.dst])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for group in sorted(groups, key=min):
        start = min(group)
        paths: dict[str, list[Edge]] = {start: []}
        queue = [start]
        while queue:
            v = queue.pop(0)
            for e in graph[v]:
                if e.dst == start:
                    found.append(paths[v] + [e])
                    queue = []
                    break
                if e.dst in group and e.dst not in paths:
                    paths[e.dst] = paths[v] + [e]
                    queue.append(e.dst)
    return found


def describe_cycle(cycle: list[Edge]) -> str:
    chain = " -> ".join([cycle[0].src] + [e.dst for e in cycle])
    return chain + "\n" + "\n".join(f"      {e.src} imports {e.dst} at {e.where}" for e in cycle)


# --- b. layering -------------------------------------------------------------------------------------------


def layering_offenders(edges: list[Edge], low: str = ENGINE, above: tuple[str, ...] = ABOVE_ENGINE) -> list[str]:
    def within(module, prefix):
        return module == prefix or module.startswith(prefix + ".")

    return [
        f"{e.where}: {e.src} imports {e.dst}"
        for e in edges
        if within(e.src, low) and any(within(e.dst, a) for a in above)
    ]


def room(module: str) -> str:
    """The room of a jaxlab module: its first name below the package ("jaxlab.engine.model" -> "engine")."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_offenders(edges: list[Edge], rooms: dict[str, set[str]] = ROOMS) -> list[str]:
    """Imports from a room into one it may not import (and rooms the table does not know)."""
    out = []
    for e in edges:
        src, dst = room(e.src), room(e.dst)
        if src == dst:
            continue
        if src not in rooms:
            out.append(f"{e.where}: the room {src!r} is not in ROOMS: say what it may import")
        elif dst not in rooms[src]:
            out.append(
                f"{e.where}: {e.src} imports {e.dst} ({src} may import {', '.join(sorted(rooms[src])) or 'nothing of jaxlab'})"
            )
    return out


# --- c. private names --------------------------------------------------------------------------------------


def python_files(root: Path, folders=SOURCES) -> list[Path]:
    return sorted(p for folder in folders for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def local_modules(root: Path, folders=SOURCES, package: str = PACKAGE) -> set[str]:
    """Modules a file of this repository can import by name: the package's, and the top-level names of the
    scripts, tests and notebook sources (``conftest``, ``nbbuild``)."""
    names = set(modules(root, package))
    names |= {p.stem for p in python_files(root, folders) if p.relative_to(root).parts[0] != package}
    return names


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)) is not None:
        return f"{base}.{node.attr}"
    return None


# namedtuple's public methods carry an underscore so that they cannot clash with field names
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def names_defined(tree: ast.AST) -> set[str]:
    """Every name the file defines: functions, classes, assigned names and attributes, arguments. A private
    attribute read on an object (``gen._plan``) is the file's own only if the file defines it somewhere."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            out.add(node.attr)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_uses(path: Path, root: Path, local: set[str], package: str = PACKAGE) -> list[str]:
    """Every private name of another module that the file imports, reads or patches: ``from m import _x``,
    ``m._x`` where m is a module of this repository, ``setattr(m, "_x", ...)`` and ``patch("jaxlab.m._x")``, and
    ``obj._x`` where the file defines no ``_x`` of its own (the attribute comes from another module's class)."""
    rel = path.relative_to(root)
    parts = rel.with_suffix("").parts
    is_package = parts[-1] == "__init__"
    module = ".".join(parts[:-1] if is_package else parts)
    tree = ast.parse(path.read_text(), filename=str(path))
    where = rel.as_posix()
    found = []
    bound: dict[str, str] = {}  # local name -> the local module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in local or alias.name.startswith(package + "."):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        head = alias.name.split(".")[0]
                        bound[head] = head
                    if any(private(p) for p in alias.name.split(".")):
                        found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, is_package, node)
            for alias in node.names:
                if private(alias.name):
                    found.append(f"{where}:{node.lineno}: from {base} import {alias.name}")
                elif f"{base}.{alias.name}" in local:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
            if base.split(".")[0] == package and any(private(p) for p in base.split(".")):
                found.append(f"{where}:{node.lineno}: from {base} import ...")

    def module_of(expr: ast.AST) -> str | None:
        """The local module an expression names (``quant``, ``jaxlab.engine.model``), if any."""
        dotted = _dotted(expr)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in bound:
            return None
        full = bound[head] + ("." + rest if rest else "")
        return full if full in local else None

    own = names_defined(tree)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            if m := module_of(node.value):
                found.append(f"{where}:{node.lineno}: {m}.{node.attr}")
            elif node.attr not in own and node.attr not in PUBLIC_UNDERSCORE and not _is_self(node.value):
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)} (an attribute this file never defines)")
        elif isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            second = node.args[1] if len(node.args) > 1 else None
            # getattr / setattr / monkeypatch.setattr(module, "_x", ...)
            if (
                isinstance(second, ast.Constant)
                and isinstance(second.value, str)
                and private(second.value)
                and (m := module_of(first))
            ):
                found.append(f"{where}:{node.lineno}: {m}.{second.value} (by name)")
            # monkeypatch.setattr("jaxlab.io.assets._x", ...), mock.patch("jaxlab...._x")
            elif (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith(package + ".")
                and all(p.isidentifier() for p in first.value.split("."))
                and any(private(p) for p in first.value.split("."))
            ):
                found.append(f"{where}:{node.lineno}: {first.value} (by name)")
    return sorted(set(found), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def all_private_uses(root: Path, folders=SOURCES, package: str = PACKAGE) -> list[str]:
    local = local_modules(root, folders, package)
    return [use for path in python_files(root, folders) for use in private_uses(path, root, local, package)]


# --- d. module length --------------------------------------------------------------------------------------


def long_modules(root: Path, package: str = PACKAGE, limit: int = MAX_LINES) -> list[str]:
    out = []
    for path in sorted((root / package).rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > limit:
            out.append(f"{path.relative_to(root).as_posix()}: {n} lines")
    return out


# --- e. tests mirror the package ---------------------------------------------------------------------------


def unmirrored_tests(root: Path, package: str = PACKAGE, exempt=TESTS_NOT_MIRRORED) -> list[str]:
    """Test folders without a package of the same name, and top-level test files without a module of the name."""
    tests, pkg = root / "tests", root / package
    out = []
    for d in sorted(p for p in tests.iterdir() if p.is_dir()):
        if d.name in exempt or d.name.startswith((".", "__")):
            continue
        if not (pkg / d.name / "__init__.py").exists():
            out.append(f"tests/{d.name}/ (no {package}/{d.name}/ package)")
    for f in sorted(tests.glob("test_*.py")):
        name = f.stem.removeprefix("test_")
        if not (pkg / f"{name}.py").exists():
            out.append(f"tests/{f.name} (no {package}/{name}.py module)")
    return out


# --- the rules, on the repository --------------------------------------------------------------------------


def _report(title: str, items: list[str]) -> str:
    return f"{len(items)} {title}:\n  " + "\n  ".join(items)


def test_no_import_cycles():
    found = cycles(import_edges(ROOT))
    assert not found, _report("import cycle(s) among jaxlab modules", [describe_cycle(c) for c in found])


def test_engine_imports_nothing_above_it():
    offenders = layering_offenders(import_edges(ROOT))
    assert not offenders, _report(f"import(s) from the engine into {', '.join(ABOVE_ENGINE)}", offenders)


def test_every_room_imports_only_the_rooms_below_it():
    offenders = room_offenders(import_edges(ROOT))
    assert not offenders, _report("import(s) across floors", offenders)


def test_every_room_is_in_the_table():
    rooms = {room(m) for m in modules(ROOT)}
    assert rooms == set(ROOMS), (
        f"rooms without a line in ROOMS: {sorted(rooms - set(ROOMS))}; lines without a room: {sorted(set(ROOMS) - rooms)}"
    )


def test_no_private_name_used_outside_its_module():
    offenders = all_private_uses(ROOT)
    assert not offenders, _report(
        "private name(s) used outside their module (make them public or move the use)", offenders
    )


def test_modules_are_short():
    offenders = long_modules(ROOT)
    assert not offenders, _report(f"module(s) over {MAX_LINES} lines (split them: one idea per module)", offenders)


def test_tests_mirror_the_package():
    offenders = unmirrored_tests(ROOT)
    assert not offenders, _report("test folder(s)/file(s) that mirror nothing in the package", offenders)


def test_test_file_names_are_unique():
    """pytest imports test files by their base name (the folders have no __init__.py): two test_x.py in
    different folders make the second one fail to collect."""
    seen: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    offenders = [" and ".join(paths) for paths in seen.values() if len(paths) > 1]
    assert not offenders, _report("test file(s) sharing a base name", offenders)


# --- the checkers can fail ---------------------------------------------------------------------------------


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_room_importing_above_its_floor_is_found(tmp_path):
    root = write(
        tmp_path,
        {
            "jaxlab/__init__.py": "",
            "jaxlab/io/__init__.py": "",
            "jaxlab/io/gguf.py": "from jaxlab.engine.config import LlamaConfig\n",
            "jaxlab/engine/__init__.py": "",
            "jaxlab/engine/config.py": "def f():\n    from jaxlab.tools import profile\n",
            "jaxlab/engine/model.py": "from jaxlab.io import gguf\n",  # downward: fine
            "jaxlab/tools/__init__.py": "",
            "jaxlab/tools/profile.py": "",
            "jaxlab/newroom/__init__.py": "from jaxlab.io import gguf\n",
        },
    )
    found = room_offenders(import_edges(root))
    assert any("jaxlab/io/gguf.py:1: jaxlab.io.gguf imports jaxlab.engine.config" in f for f in found)
    assert any("jaxlab/engine/config.py:2: jaxlab.engine.config imports jaxlab.tools.profile" in f for f in found)
    assert any("'newroom' is not in ROOMS" in f for f in found)
    assert len(found) == 3, found


def test_a_cycle_is_found_with_its_lines(tmp_path):
    write(
        tmp_path,
        {
            "jaxlab/__init__.py": "",
            "jaxlab/engine/__init__.py": "",
            "jaxlab/engine/a.py": "from jaxlab.engine import b\n",
            "jaxlab/engine/b.py": "def f():\n    from . import a  # inside a function: still an edge\n",
            "jaxlab/engine/c.py": "from jaxlab.engine.a import x\n",  # into the cycle, not part of it
        },
    )
    found = cycles(import_edges(tmp_path))
    assert len(found) == 1
    assert [(e.src, e.dst) for e in found[0]] == [
        ("jaxlab.engine.a", "jaxlab.engine.b"),
        ("jaxlab.engine.b", "jaxlab.engine.a"),
    ]
    text = describe_cycle(found[0])
    assert "jaxlab/engine/a.py:1" in text and "jaxlab/engine/b.py:2" in text


def test_imports_resolve_to_modules(tmp_path):
    write(
        tmp_path,
        {
            "jaxlab/__init__.py": "from .engine import model\n",
            "jaxlab/engine/__init__.py": "from . import model\nfrom .model import forward\n",
            "jaxlab/engine/model.py": "import jaxlab.io.gguf as g\nfrom ..io import gguf\nfrom jaxlab import errors\n",
            "jaxlab/io/__init__.py": "",
            "jaxlab/io/gguf.py": "import numpy\nfrom jaxlab.io import *\n",
            "jaxlab/errors.py": "",
        },
    )
    assert {(e.src, e.dst) for e in import_edges(tmp_path)} == {
        ("jaxlab", "jaxlab.engine.model"),
        ("jaxlab.engine", "jaxlab.engine.model"),
        ("jaxlab.engine.model", "jaxlab.io.gguf"),
        ("jaxlab.engine.model", "jaxlab.errors"),
        ("jaxlab.io.gguf", "jaxlab.io"),
    }
    assert cycles(import_edges(tmp_path)) == []


def test_the_engine_importing_lab_is_found(tmp_path):
    write(
        tmp_path,
        {
            "jaxlab/__init__.py": "",
            "jaxlab/cli.py": "from jaxlab.engine import generate\n",  # a face importing the engine: fine
            "jaxlab/engine/__init__.py": "",
            "jaxlab/engine/generate.py": "def plot():\n    from jaxlab.lab import plots\n    import jaxlab.cli\n",
            "jaxlab/lab/__init__.py": "",
            "jaxlab/lab/plots.py": "",
        },
    )
    assert layering_offenders(import_edges(tmp_path)) == [
        "jaxlab/engine/generate.py:3: jaxlab.engine.generate imports jaxlab.cli",
        "jaxlab/engine/generate.py:2: jaxlab.engine.generate imports jaxlab.lab.plots",
    ]


def test_private_imports_and_attributes_are_found(tmp_path):
    write(
        tmp_path,
        {
            "jaxlab/__init__.py": "",
            "jaxlab/quant.py": "def _unpack(): ...\ndef unpack(): return _unpack()\n",
            "jaxlab/engine/__init__.py": "",
            "jaxlab/engine/model.py": "from jaxlab.quant import _unpack as unpack\n",
            "tests/conftest.py": "_SECRET = 1\nHELPER = 2\n",
            "tests/test_x.py": (
                "import jaxlab.quant\n"
                "from jaxlab import quant\n"
                "from jaxlab import quant as q\n"
                "from conftest import HELPER, _SECRET\n"
                "import numpy as np\n"
                "class C:\n"
                "    _own = 1\n"
                "def test(monkeypatch, obj):\n"
                "    quant._unpack()\n"
                "    q._unpack\n"
                "    jaxlab.quant._unpack\n"
                "    monkeypatch.setattr(quant, '_unpack', None)\n"
                "    monkeypatch.setattr('jaxlab.quant._unpack', None)\n"
                "    quant.unpack(); C._own; quant.__name__; obj._replace(a=1)\n"
                "    obj._plan\n"
                "    self._own = 1; obj._own\n"
            ),
            "scripts/tool.py": "import inspect as _inspect\nfrom jaxlab.quant import unpack as _unpack\n",
        },
    )
    assert all_private_uses(tmp_path) == [
        "jaxlab/engine/model.py:1: from jaxlab.quant import _unpack",
        "tests/test_x.py:4: from conftest import _SECRET",
        "tests/test_x.py:9: jaxlab.quant._unpack",
        "tests/test_x.py:10: jaxlab.quant._unpack",
        "tests/test_x.py:11: jaxlab.quant._unpack",
        "tests/test_x.py:12: jaxlab.quant._unpack (by name)",
        "tests/test_x.py:13: jaxlab.quant._unpack (by name)",
        "tests/test_x.py:15: obj._plan (an attribute this file never defines)",
    ]


def test_long_modules_and_unmirrored_tests_are_found(tmp_path):
    write(
        tmp_path,
        {
            "jaxlab/__init__.py": "",
            "jaxlab/engine/__init__.py": "",
            "jaxlab/engine/big.py": "x = 1\n" * (MAX_LINES + 1),
            "jaxlab/engine/small.py": "x = 1\n" * MAX_LINES,
            "jaxlab/cli.py": "",
            "tests/engine/test_big.py": "",
            "tests/house/test_structure.py": "",
            "tests/serve/test_http.py": "",
            "tests/test_cli.py": "",
            "tests/test_server.py": "",
        },
    )
    assert long_modules(tmp_path) == [f"jaxlab/engine/big.py: {MAX_LINES + 1} lines"]
    assert unmirrored_tests(tmp_path) == [
        "tests/serve/ (no jaxlab/serve/ package)",
        "tests/test_server.py (no jaxlab/server.py module)",
    ]
