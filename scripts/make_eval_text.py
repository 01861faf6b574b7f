"""Write data/eval/stdlib.txt: the offline evaluation text of ``jaxlab.quant.quality`` (perplexity, KL, agreement).

The text is two kinds of public, PSF-licensed Python standard-library text, read from the ``.py`` files of
the running interpreter with ``ast`` (nothing is imported or executed):

* **prose** — for each module in ``PROSE``: its docstring, then every public function, class and method
  (source order) as a pydoc-like entry, ``name(signature)`` followed by its docstring: English technical
  writing with some doctest examples;
* **code** — the complete source of each module in ``CODE`` (comments and docstrings included).

Deterministic: fixed module lists, source order, ``inspect.cleandoc`` for indentation, trailing spaces
stripped, LF line ends. Docstrings and ``ast.unparse`` change between Python versions, which is why the
output is shipped in the repository (``data/eval/README.md`` names the version that wrote it) instead of
being rebuilt at run time. Run it with ``.venv/bin/python scripts/make_eval_text.py`` (stdlib only).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import json
import platform
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "data" / "eval"
PROSE = ("heapq", "bisect", "textwrap", "fractions", "statistics", "shlex", "sched", "queue")
CODE = ("colorsys", "graphlib")
PROSE_MAX_CHARS = 3600  # entries stop before a module's section passes this: no module dominates the prose


def source_of(module: str) -> str:
    return Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8")


def _entries(body: list[ast.stmt], prefix: str):
    """(title, docstring) of every public function and class in ``body`` and of their public methods."""
    for node in body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or node.name.startswith("_"):
            continue
        doc = ast.get_docstring(node)
        if isinstance(node, ast.ClassDef):
            if doc:
                yield f"class {prefix}{node.name}", doc
            yield from _entries(node.body, f"{prefix}{node.name}.")
        elif doc:
            yield f"{prefix}{node.name}({ast.unparse(node.args)})", doc


def prose(module: str) -> str:
    """The module's docstring and then its public docstrings, pydoc-like, up to PROSE_MAX_CHARS characters."""
    tree = ast.parse(source_of(module))
    lead = ast.get_docstring(tree) or ""
    if module == "heapq":  # heapq's essay on heaps (__about__) repeats and extends its docstring: use it instead
        lead = next(
            n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__about__" for t in n.targets)
        )
    parts = [f"{module}\n{'=' * len(module)}\n\n{inspect.cleandoc(lead)}"]
    size = len(parts[0])
    for title, doc in _entries(tree.body, f"{module}."):
        entry = f"{title}\n\n{inspect.cleandoc(doc)}"
        if size + len(entry) > PROSE_MAX_CHARS:
            break
        parts.append(entry)
        size += len(entry)
    return "\n\n".join(parts)


def clean(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines()) + "\n"


def build() -> tuple[str, list[dict]]:
    """-> (the text, one {module, kind, chars} per section)."""
    sections = [(m, "prose", clean(prose(m))) for m in PROSE]
    sections += [(m, "code", clean(f"# file: Lib/{m}.py\n\n{source_of(m)}")) for m in CODE]
    text = "\n\n".join(s for _, _, s in sections)
    return text, [{"module": m, "kind": k, "chars": len(s)} for m, k, s in sections]


def main() -> int:
    text, sections = build()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "stdlib.txt").write_text(text, encoding="utf-8", newline="\n")
    manifest = {
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        "bytes": len(text.encode("utf-8")),
        "sections": sections,
    }
    (OUT / "stdlib.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(
        f"wrote {OUT / 'stdlib.txt'}: {manifest['bytes']} bytes, {len(sections)} sections, Python {manifest['python']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
