"""The layer map of DESIGN.md, checked on the source: arrows point down only, benchmarks use public names."""

import ast
import subprocess
import sys
from pathlib import Path

import factkernels

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "factkernels"


def _imported_modules(path: Path) -> set[str]:
    """Absolute dotted names of every factkernels module ``path`` imports (relative imports resolved)."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            stem = ".".join(base + ([node.module] if node.module else []))
            names.add(stem)
            names.update(f"{stem}.{alias.name}" for alias in node.names)
    return {n.removesuffix(".__init__") for n in names if n.startswith("factkernels")}


def _library_files() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if "experiments" not in p.parts and p.name not in ("cli.py", "__main__.py")]


def test_the_library_never_imports_experiments_or_the_cli():
    for path in _library_files():
        above = {n for n in _imported_modules(path)
                 if n.startswith(("factkernels.experiments", "factkernels.cli", "factkernels.__main__"))}
        assert not above, f"{path.relative_to(ROOT)} imports {sorted(above)}"


def test_hf_never_imports_the_toy_transformer():
    for path in (PACKAGE / "hf").rglob("*.py"):
        toy = {n for n in _imported_modules(path) if n.startswith("factkernels.transformer")}
        assert not toy, f"{path.relative_to(ROOT)} imports {sorted(toy)}"


def test_the_import_walk_sees_relative_imports():
    # the checks above would pass vacuously if relative imports were not resolved
    names = _imported_modules(PACKAGE / "hf" / "requests.py")
    assert "factkernels.datasets" in names and "factkernels.datasets.load_book_authors" in names


def test_benchmarks_use_public_names_only():
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("factkernels"):
                private = [a.name for a in node.names if a.name.startswith("_") and a.name != "_ops"]
                assert not private, f"{path.relative_to(ROOT)} imports private {private} from {node.module}"


# Every factkernels module but the plotting helper, with matplotlib unimportable (as without the extra).
_WITHOUT_MATPLOTLIB = """
import importlib, pkgutil, sys
sys.modules["matplotlib"] = None  # import matplotlib now raises ModuleNotFoundError
import factkernels
names = [m.name for m in pkgutil.walk_packages(factkernels.__path__, "factkernels.")
         if m.name not in ("factkernels.__main__", "factkernels.experiments.plotting")]
for name in names:
    importlib.import_module(name)
print(len(names))
try:
    import factkernels.experiments.plotting
except ModuleNotFoundError as error:
    print(error)
"""


def test_the_library_imports_without_matplotlib_and_plots_name_the_extra():
    # run where the tested package is importable (site-packages after `pip install .`, the checkout otherwise)
    done = subprocess.run([sys.executable, "-c", _WITHOUT_MATPLOTLIB], capture_output=True, text=True, timeout=300,
                          cwd=Path(factkernels.__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    count, message = done.stdout.strip().splitlines()
    assert int(count) > 50  # every module was imported, experiments and the CLI included
    assert message == 'experiment plots need matplotlib: pip install "factkernels[experiments]"'
