"""The Python package's public API as lines of text, read from its source
(the stubs where a module has them) without importing it, and compared with
a committed baseline: the previous release's.

A line is one of
    livereg.Table                     a public name of a public module
    livereg.Table.clear               a public member of a public class
    livereg.Table.clear(timeout=)     a keyword a public callable takes
    livereg.ExistsError: FileExistsError   a public class's base

A program written against the baseline runs against the package as long as
every baseline line is still there: a line gone is a name removed, a
parameter removed or renamed, or a base dropped. Lines added are new API.

Usage:
    python_api.py dump PACKAGE_DIR                 print the lines
    python_api.py check PACKAGE_DIR BASELINE [--python PYTHON]
        fail on every baseline line the package no longer has; with
        --python, also ask that interpreter's installed package (its
        runtime ``__all__`` and attributes) for the baseline's names.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

#: The public modules: the package and its LMCache integration.
PUBLIC_MODULES = ("livereg", "livereg.lmcache")
#: Dunder members that are API (construction, calling, context managers).
PUBLIC_DUNDERS = {"__init__", "__call__", "__enter__", "__exit__", "__aenter__", "__aexit__", "__version__"}


def public(name: str) -> bool:
    return not name.startswith("_") or name in PUBLIC_DUNDERS


class Package:
    """The source files of a package directory (``.../livereg``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = root.name
        self._trees: Dict[str, Optional[ast.Module]] = {}

    def _base(self, module: str) -> Path:
        return self.root.joinpath(*module.split(".")[1:])

    def has_stub(self, module: str) -> bool:
        base = self._base(module)
        return (base / "__init__.pyi").exists() or base.with_suffix(".pyi").exists()

    def tree(self, module: str) -> Optional[ast.Module]:
        """The module's stub if it has one, else its source."""
        if module not in self._trees:
            base = self._base(module)
            candidates = [base / "__init__.pyi", base / "__init__.py", base.with_suffix(".pyi"), base.with_suffix(".py")]
            found = next((path for path in candidates if path.exists()), None)
            self._trees[module] = ast.parse(found.read_text()) if found else None
        return self._trees[module]


def top_level(tree: ast.Module) -> Iterator[ast.stmt]:
    """Module-level statements, those under ``if`` (``TYPE_CHECKING``) and
    ``try`` included."""
    stack: List[ast.stmt] = list(reversed(tree.body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            stack += reversed(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack += reversed(node.body + node.orelse)
        else:
            yield node


def literal_all(tree: ast.Module) -> Optional[List[str]]:
    for node in top_level(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return [str(name) for name in ast.literal_eval(node.value)]
            except ValueError:
                return None
    return None


def type_check_only(node: ast.stmt) -> bool:
    decorators = getattr(node, "decorator_list", [])
    return any(ast.unparse(d).endswith("type_check_only") for d in decorators)


def defined(tree: ast.Module) -> Dict[str, ast.stmt]:
    """What the module defines itself (classes, functions, variables)."""
    found: Dict[str, ast.stmt] = {}
    for node in top_level(tree):
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(node.name, node)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    found.setdefault(target.id, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found.setdefault(node.target.id, node)
    return found


def imported(tree: ast.Module) -> Tuple[Dict[str, Tuple[str, str]], List[str], Set[str]]:
    """``from M import X [as Y]`` at module level: Y -> (M, X); the modules
    imported with ``*``; the names re-exported as ``X as X``."""
    names: Dict[str, Tuple[str, str]] = {}
    stars: List[str] = []
    reexported: Set[str] = set()
    for node in top_level(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if alias.name == "*":
                    stars.append(node.module)
                else:
                    names[alias.asname or alias.name] = (node.module, alias.name)
                    if alias.asname == alias.name:
                        reexported.add(alias.name)
    return names, stars, reexported


class Api:
    def __init__(self, package: Package) -> None:
        self.package = package
        self.lines: Set[str] = set()

    def starred(self, module: str) -> List[str]:
        """What ``from module import *`` gives a type checker: a stub's
        public definitions, a source's ``__all__``."""
        tree = self.package.tree(module)
        if tree is None:
            return []
        listed = literal_all(tree)
        if listed is not None and not self.package.has_stub(module):
            return listed
        return [name for name, node in defined(tree).items()
                if not name.startswith("_") and not type_check_only(node)]

    def resolve(self, module: str, name: str, depth: int = 0) -> Tuple[Optional[ast.Module], Optional[ast.stmt]]:
        """The definition of ``module.name``, following re-exports."""
        tree = self.package.tree(module)
        if tree is None or depth > 5:
            return None, None
        here = defined(tree)
        if name in here:
            return tree, here[name]
        names, stars, _ = imported(tree)
        if name in names and names[name][0].startswith(self.package.name):
            return self.resolve(names[name][0], names[name][1], depth + 1)
        for star in stars:
            if name in self.starred(star):
                return self.resolve(star, name, depth + 1)
        return None, None

    def module(self, module: str) -> None:
        tree = self.package.tree(module)
        if tree is None:
            raise SystemExit(f"{module}: no source under {self.package.root}")
        names, stars, reexported = imported(tree)
        listed = literal_all(tree)
        if listed is None:
            listed = [name for star in stars for name in self.starred(star)]
            listed += [name for name, (home, _) in names.items()
                       if public(name) and home.startswith(self.package.name)]
        for name in sorted({*listed, *reexported}):
            if not public(name):
                continue
            self.lines.add(f"{module}.{name}")
            owner, node = self.resolve(module, name)
            if owner is not None and node is not None:
                self.definition(f"{module}.{name}", owner, node)

    def definition(self, path: str, owner: ast.Module, node: ast.stmt) -> None:
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                text = ast.unparse(base)
                if not text.split(".")[-1].startswith("_") and text not in ("object", "final"):
                    self.lines.add(f"{path}: {text}")
            for member in node.body:
                self.member(path, owner, member)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self.parameters(path, owner, node, method=False)

    def member(self, path: str, owner: ast.Module, node: ast.stmt) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if not public(node.name):
                return
            self.lines.add(f"{path}.{node.name}")
            decorators = {ast.unparse(d) for d in node.decorator_list}
            if "property" in decorators or any(d.endswith(".setter") for d in decorators):
                return
            self.parameters(f"{path}.{node.name}", owner, node, method="staticmethod" not in decorators)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and public(node.target.id):
            self.lines.add(f"{path}.{node.target.id}")
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and public(target.id):
                    self.lines.add(f"{path}.{target.id}")

    def parameters(self, path: str, owner: ast.Module, node: ast.FunctionDef | ast.AsyncFunctionDef,
                   method: bool) -> None:
        args = node.args
        positional = args.args[1:] if method and args.args else args.args
        for arg in [*positional, *args.kwonlyargs]:
            # A stub's `__name` is positional-only by convention.
            if not (arg.arg.startswith("__") and not arg.arg.endswith("__")):
                self.lines.add(f"{path}({arg.arg}=)")
        if args.kwarg is not None and args.kwarg.annotation is not None:
            # `**options: Unpack[SomeTypedDict]`: its keys are keywords.
            annotation = ast.unparse(args.kwarg.annotation)
            if annotation.startswith("Unpack[") and annotation.endswith("]"):
                typed = defined(owner).get(annotation[len("Unpack["):-1])
                if isinstance(typed, ast.ClassDef):
                    for field in typed.body:
                        if isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name):
                            self.lines.add(f"{path}({field.target.id}=)")


def dump(root: Path) -> List[str]:
    api = Api(Package(root))
    for module in PUBLIC_MODULES:
        api.module(module)
    return sorted(api.lines)


RUNTIME = """
import json, sys, livereg, livereg.lmcache
found = {}
for module, names in json.loads(sys.argv[1]).items():
    target = sys.modules[module]
    listed = set(getattr(target, "__all__", ()))
    found[module] = [n for n in names if n in listed or (module == "livereg" and hasattr(target, n))]
print(json.dumps(found))
"""


def runtime_missing(python: str, baseline: List[str]) -> List[str]:
    """The baseline's module-level names the installed package lacks (in
    its ``__all__``, or for ``livereg`` as an attribute)."""
    names: Dict[str, List[str]] = {module: [] for module in PUBLIC_MODULES}
    for line in baseline:
        if "(" in line or ":" in line:
            continue
        module, _, name = line.rpartition(".")
        if module in names:
            names[module].append(name)
    answer = subprocess.run([python, "-c", RUNTIME, json.dumps(names)], capture_output=True, text=True, check=True)
    found = json.loads(answer.stdout)
    return [f"{module}.{name} (at run time)" for module, wanted in names.items()
            for name in wanted if name not in found[module]]


def read_baseline(path: Path) -> List[str]:
    return [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def main(argv: List[str]) -> int:
    if len(argv) >= 2 and argv[0] == "dump":
        print("\n".join(dump(Path(argv[1]))))
        return 0
    if len(argv) >= 3 and argv[0] == "check":
        baseline = read_baseline(Path(argv[2]))
        now = set(dump(Path(argv[1])))
        missing = [line for line in baseline if line not in now]
        if "--python" in argv:
            missing += runtime_missing(argv[argv.index("--python") + 1], baseline)
        added = len(now - set(baseline))
        if missing:
            print(f"the Python package lost {len(missing)} public name(s) of the previous release "
                  f"({argv[2]}): removed, or a parameter removed or renamed:", file=sys.stderr)
            for line in missing:
                print(f"  {line}", file=sys.stderr)
            return 1
        print(f"Python public API: the {len(baseline)} names and parameters of {argv[2]} all kept ({added} added)")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
