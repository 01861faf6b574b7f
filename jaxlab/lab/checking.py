"""`jaxlab check NN [NOTEBOOK]`: run a student's saved notebook's exercises through their checks.

In a workshop each student saves their copy of notebook NN; ``jaxlab check 04`` (or ``jaxlab check 04
path/to/04_jit_and_generation.ipynb``) reads the saved file, runs the code cells of its Exercises section, in
order, in a fresh namespace (the exercise modules ``nbNN``, and the model as ``m`` when a cell uses it), and
reports each ``nbNN.check_*`` call: PASS or FAIL with the checker's reason. It exits 0 only when every check
passes, so an untouched copy (every exercise still ``raise NotImplementedError``) fails.

``jaxlab check track [FOLDER]`` assembles the pieces of notebooks 04, 05, 06 and 11 into one generation loop and
runs it on the real model against the golden tokens (:mod:`jaxlab.lab.exercises.track`, which reads the notebooks
with :func:`definitions`; the command line sends ``track`` there).

Only the Exercises section runs, after the notebook's own imports (every ``import`` and ``from ... import`` of
the cells above it, so an answer may use ``jnp``, ``np``, ``jax`` or ``jaxlab`` as it did in the notebook): the
measurements above it are not repeated, and a cell that raises is reported as one line and the next cell runs.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import importlib
import io
import json
import pkgutil
from pathlib import Path

from jaxlab.errors import JaxlabError

SECTION = "## Exercises"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "number", metavar="NN", help="the notebook's number, e.g. 04; or `track`: the build-the-engine track"
    )
    parser.add_argument(
        "notebook",
        nargs="?",
        default=None,
        type=Path,
        help="the saved notebook (default: NN_*.ipynb in this folder, else in notebooks/); for `track`, the folder "
        "that holds your saved 04, 05, 06 and 11",
    )


def find_notebook(number: str, given: Path | None = None, where: Path | None = None) -> Path:
    if not (number.isdigit() and len(number) <= 2):
        raise JaxlabError(f"{number!r} is not a notebook number: give two digits, e.g. `jaxlab check 04`")
    nn = number.zfill(2)
    if given is not None:
        if not given.is_file():
            raise JaxlabError(f"{given}: no such file; give the path of your saved notebook")
        return given
    where = where or Path.cwd()
    for folder in (where, where / "notebooks"):
        found = sorted(folder.glob(f"{nn}_*.ipynb"))
        if found:
            return found[0]
    raise JaxlabError(f"no {nn}_*.ipynb here or in notebooks/: give the notebook's path, `jaxlab check {nn} FILE`")


def notebook_cells(path: Path) -> list[dict]:
    """A saved notebook's cells (its JSON), or one line saying the file is not a notebook and what to do."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))["cells"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise JaxlabError(
            f"{path}: not a readable notebook ({type(e).__name__}); save it from Jupyter and retry"
        ) from None


def _cells(path: Path) -> tuple[list[dict], int]:
    """The notebook's cells, and the index of its Exercises heading."""
    cells = notebook_cells(path)
    start = next((i for i, c in enumerate(cells) if c.get("cell_type") == "markdown" and SECTION in _text(c)), None)
    if start is None:
        raise JaxlabError(f"{path}: no '{SECTION}' section: is this one of the lab's notebooks?")
    return cells, start


def _text(c: dict) -> str:
    s = c.get("source", "")
    return s if isinstance(s, str) else "".join(s)


def exercise_cells(path: Path) -> list[str]:
    """The sources of the code cells after the notebook's Exercises heading."""
    cells, start = _cells(path)
    return [_text(c) for c in cells[start:] if c.get("cell_type") == "code" and _text(c).strip()]


def notebook_imports(path: Path) -> str:
    """Every top-level ``import`` / ``from ... import`` of the code cells above the Exercises heading, as one
    source: what the student's kernel had imported when they wrote their answers."""
    cells, start = _cells(path)
    found = []
    for c in cells[:start]:
        tree = _parse(_text(c)) if c.get("cell_type") == "code" else None
        found += [ast.unparse(n) for n in (tree.body if tree else []) if isinstance(n, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(found))


def exercise_modules():
    from jaxlab.lab import exercises

    return {
        m.name: importlib.import_module(f"jaxlab.lab.exercises.{m.name}")
        for m in pkgutil.iter_modules(exercises.__path__)
        if m.name.startswith("nb")
    }


def check_functions(modules) -> list[tuple]:
    """(module, name, function) of every ``check_*`` the exercise modules define (not those they import)."""
    return [
        (mod, name, fn)
        for mod in modules.values()
        for name in dir(mod)
        if name.startswith("check_")
        and callable(fn := getattr(mod, name))
        and getattr(fn, "__module__", None) == mod.__name__
    ]


@contextlib.contextmanager
def recording(modules, results: list):
    """Every ``check_*`` of the exercise modules records (name, passed, what it printed) while inside."""
    saved = check_functions(modules)
    depth = [0]  # a check that calls another check is one result
    for mod, name, fn in saved:

        @functools.wraps(fn)
        def wrapper(*a, _fn=fn, _name=f"{mod.__name__.rsplit('.', 1)[1]}.{name}", **kw):
            if depth[0]:
                return _fn(*a, **kw)
            buf = io.StringIO()
            depth[0] += 1
            try:
                with contextlib.redirect_stdout(buf):
                    ok = _fn(*a, **kw)
            finally:
                depth[0] -= 1
            results.append((_name, bool(ok), buf.getvalue().strip()))
            return ok

        setattr(mod, name, wrapper)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def namespace(number: str, sources: list[str], modules, imports: str = "") -> dict:
    ns = {"__name__": "__main__", **modules, "ex": modules.get(f"nb{number}")}
    if imports:
        exec(compile(imports, "<the notebook's imports>", "exec"), ns)
        ns.update(modules)  # the exercise modules win over a same-named import
    used = {
        n.id
        for s in sources
        for n in ast.walk(_parse(s) or ast.Module(body=[], type_ignores=[]))
        if isinstance(n, ast.Name)
    }
    if "m" in used:
        from jaxlab.engine.loading import load

        ns["m"] = load()
    return ns


def _parse(src: str):
    try:
        return ast.parse(src)
    except SyntaxError:
        return None


def run_cells(path: Path, sources: list[str], ns: dict) -> list[str]:
    """Run the exercise cells in ``ns``, in order, their prints swallowed -> one line per cell that failed (a syntax
    error, or what it raised); the next cell runs all the same. A cell's code is compiled under the name
    ``<NAME.ipynb: exercise cell N>``, so a traceback through a student's function names its notebook and cell."""
    problems = []
    for i, src in enumerate(sources, 1):
        if _parse(src) is None:
            problems.append(f"exercise cell {i}: a syntax error; fix it and save")
            continue
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(src, f"<{path.name}: exercise cell {i}>", "exec"), ns)
        except Exception as e:  # the student's code: one line, then the next cell
            first = (str(e).strip().splitlines() or [""])[0]
            problems.append(f"exercise cell {i}: raised {type(e).__name__}: {first}")
    return problems


@contextlib.contextmanager
def checks_off(modules):
    """Every ``check_*`` of the exercise modules returns True at once while inside: a notebook's cells run for
    the functions they define, not for their checks (the build-the-engine track runs its own)."""
    saved = check_functions(modules)
    for mod, name, _ in saved:
        setattr(mod, name, lambda *a, **kw: True)
    try:
        yield
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)


def notebook_namespace(nn: str, path: Path, sources: list[str], modules) -> dict:
    """:func:`namespace` after the saved notebook's imports, or one line naming the import that failed."""
    try:
        return namespace(nn, sources, modules, notebook_imports(path))
    except Exception as e:  # an import of the notebook's that this environment lacks
        raise JaxlabError(f"{path}: running the notebook's imports raised {type(e).__name__}: {e}") from None


def definitions(number: str, path: Path) -> tuple[dict, list[str]]:
    """What a saved notebook's Exercises cells define (their namespace, after its imports), with its checks off,
    and one line per cell that failed (:func:`run_cells`)."""
    sources, modules = exercise_cells(path), exercise_modules()
    ns = notebook_namespace(number.zfill(2), path, sources, modules)
    with checks_off(modules):
        return ns, run_cells(path, sources, ns)


def check_notebook(number: str, path: Path, out) -> int:
    nn = number.zfill(2)
    sources = exercise_cells(path)
    modules = exercise_modules()
    if f"nb{nn}" not in modules:
        raise JaxlabError(f"notebook {nn} has no exercise checks in this jaxlab")
    results: list = []
    ns = notebook_namespace(nn, path, sources, modules)
    out.write(f"checking the exercises of {path}\n")
    with recording(modules, results):
        problems = run_cells(path, sources, ns)
    for name, ok, said in results:
        detail = said.splitlines()[-1] if said else ""
        out.write(f"{'PASS' if ok else 'FAIL'}  {name}" + (f"  -  {detail}" if detail and not ok else "") + "\n")
    for p in problems:
        out.write(f"FAIL  {p}\n")
    passed = sum(ok for _, ok, _ in results)
    total = len(results) + len(problems)
    if not results:
        out.write("no exercise check ran: are the check cells still in the notebook?\n")
        return 1
    out.write(f"{passed} of {total} pass\n")
    return 0 if passed == total else 1


def run(args, out) -> int:
    return check_notebook(args.number, find_notebook(args.number, args.notebook), out)
