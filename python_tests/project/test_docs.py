"""README.md and docs/ stay true: snippets run, command lines parse, links and named modules exist, tables equal
what the committed JSON gives, and the README stays short."""

import ast
import importlib
import importlib.util
import json
import pkgutil
import re
import shlex
from pathlib import Path

import pytest

from factkernels.cli import build_parser


def _repository() -> Path:
    for folder in Path(__file__).resolve().parents:
        if (folder / "pyproject.toml").exists():
            return folder
    raise FileNotFoundError("no pyproject.toml above the tests")


ROOT = _repository()
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").rglob("*.md"))
# A python block the README marks `<!-- snippet: run -->` runs here; the others need training runs or a real model.
RUN_SNIPPETS = re.findall(r"<!-- snippet: run -->\n```python\n(.*?)```", README, re.S)


def test_readme_is_the_short_front_door():
    assert len(README.splitlines()) <= 250


def test_readme_snippets_run():
    # Core API (construct, FactBuilder, baselines and capacity, attention), in order, in one namespace.
    assert len(RUN_SNIPPETS) >= 4
    namespace: dict = {}
    for snippet in RUN_SNIPPETS:
        exec(compile(snippet, "README.md snippet", "exec"), namespace)
    assert namespace["builder"].failed == 0 and namespace["cost"].parameters > 0


@pytest.mark.parametrize("snippet", re.findall(r"```python\n(.*?)```", README, re.S), ids=lambda s: s.split("\n")[0])
def test_readme_snippet_names_exist(snippet):
    # Every block, run or not: its imports work and the module attributes it calls exist (modules move).
    compile(snippet, "README.md snippet", "exec")
    namespace: dict = {}
    for line in snippet.splitlines():
        if line.startswith(("import ", "from ")):
            exec(line.split("  #")[0], namespace)
    modules = {name: value for name, value in namespace.items() if type(value).__name__ == "module"}
    for base, attribute in re.findall(r"\b(\w+)\.(\w+)\b", snippet):
        if base in modules:
            assert hasattr(modules[base], attribute), f"{base}.{attribute} (README snippet) does not exist"


def _make_docs():
    spec = importlib.util.spec_from_file_location("make_docs", ROOT / "benchmarks" / "make_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docs_tables_equal_what_the_json_gives():
    make_docs = _make_docs()
    assert make_docs.stale_pages() == [], "run python benchmarks/make_docs.py and commit the pages"
    marked = [page for page in make_docs.pages() if "<!-- table:" in page.read_text()]
    assert len(marked) >= 4


def test_make_docs_rewrites_a_changed_table_and_refuses_unknown_ones():
    make_docs = _make_docs()
    path = ROOT / "docs" / "results" / "kernels.md"
    page = path.read_text()
    tampered = re.sub(r"(<!-- table:cpu-kernels -->\n)\| kernel(.*?)<!-- /table -->", r"\1| made up |\n<!-- /table -->",
                      page, flags=re.S)
    assert tampered != page and make_docs.render(tampered, path) == page
    with pytest.raises(KeyError, match="no-such-table"):
        make_docs.render("<!-- table:no-such-table -->\n<!-- /table -->", path)


def _command_lines(text: str) -> list[str]:
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith("factkernels ") or " -m factkernels " in line:
                lines.append(line.split("factkernels ", 1)[1])
    return lines


@pytest.mark.parametrize("line", [line for page in [ROOT / "README.md", *DOCS] for line in _command_lines(page.read_text())])
def test_command_lines_parse(line):
    # Every `factkernels ...` line of a bash block in README.md and docs/ is a command the CLI accepts.
    build_parser().parse_args(shlex.split(line))


def _relative_links(path: Path) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", path.read_text())
    return [link.split("#")[0] for link in links if not re.match(r"[a-z]+:", link) and not link.startswith("#")]


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(path):
    missing = [link for link in _relative_links(path) if not (path.parent / link).exists()]
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            if not hasattr(found, attribute):
                return False
            found = getattr(found, attribute)
        return True
    return False


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_named_files_and_modules_exist(path):
    # Modules move: every repository path and every dotted factkernels name a page mentions must still exist.
    text = path.read_text()
    files = {name.rstrip(".,)") for name in
             re.findall(r"(?<![\w/.-])((?:factkernels|benchmarks|python_tests|csrc)/[\w./{},*-]+)", text)
             if not set("{*") & set(name)}  # patterns such as rgr-*/ or n{10,100}
    missing = sorted(name for name in files if not (ROOT / name).exists())
    missing += sorted({name for name in re.findall(r"\bfactkernels(?:\.\w+)+", text) if not _resolves(name)})
    scripts = {path.name for folder in ("factkernels", "benchmarks", "python_tests") for path in (ROOT / folder).rglob("*.py")}
    missing += sorted({name for name in re.findall(r"`(?:[\w.-]+/)*(\w+\.py)`", text) if name not in scripts})
    assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"


def test_readme_says_why_each_dependency_is_there():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    table = README.split("## Dependencies", 1)[1].split("\n## ", 1)[0]
    named = {re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]}
    for extra, requirements in project["optional-dependencies"].items():
        assert f"`{extra}` extra" in table, f"README's dependency table does not name the {extra} extra"
        named |= {re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0] for requirement in requirements}
    missing = sorted(name for name in named if not re.search(rf"(^|[ ,|]){re.escape(name)}\b", table, re.M))
    assert not missing, f"README's dependency table does not say why these are there: {missing}"


def test_generated_results_name_no_machine_folders():
    # Paths inside committed results are relative (to the repository or to the file's own folder).
    claims_header = (ROOT / "benchmarks" / "results" / "CLAIMS.md").read_text().split("\n")[2]
    command = re.search(r"`factkernels experiment report (.*?)`", claims_header)[1]
    assert not [word for word in command.split() if word.startswith("/")], command
    for summary in (ROOT / "benchmarks" / "results").rglob("summary.json"):
        figures = json.loads(summary.read_text()).get("figures", [])
        assert all("/" not in name for name in figures), f"{summary.relative_to(ROOT)}: {figures}"


def _modules_by_short_name() -> dict:
    import factkernels

    found: dict = {}
    for module in pkgutil.walk_packages(factkernels.__path__, "factkernels."):
        found.setdefault(module.name.rsplit(".", 1)[1], []).append(module.name)
    return found


@pytest.mark.parametrize("path", [ROOT / "README.md", *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_named_attributes_exist(path):
    # `module.name` in a page (e.g. `_ops.star_topk`, `capacity.SERIAL_LOGITS`) names something that exists.
    text = path.read_text()
    assigned = set(re.findall(r"^\s*(\w+)\s*(?:,\s*\w+\s*)*=", "\n".join(re.findall(r"```python\n(.*?)```", text, re.S)),
                              re.M))
    modules = _modules_by_short_name()
    missing = []
    for base, attribute in sorted(set(re.findall(r"`(\w+)\.(\w+)[`(\[ ]", text))):
        if base not in modules or base in assigned or attribute in ("py", "png", "json", "md", "sh"):
            continue
        if not any(_resolves(f"{module}.{attribute}") for module in modules[base]):
            missing.append(f"{base}.{attribute}")
    assert not missing, f"{path.relative_to(ROOT)} names what does not exist: {missing}"


def _package_imports() -> dict:
    """{unit: units it imports}, a unit being a top-level module (file stem) or subpackage of factkernels."""
    package = ROOT / "factkernels"
    edges: dict = {}
    for path in package.rglob("*.py"):
        if path == package / "__init__.py":  # the public API re-exports from every row
            continue
        parts = path.relative_to(package).parts
        unit = parts[0] if len(parts) > 1 else path.stem
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        base = (module if path.name == "__init__.py" else module.rsplit(".", 1)[0]).split(".")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem = ".".join((base[:len(base) - node.level + 1] if node.level else []) + [node.module or ""])
                names = [stem.rstrip(".")] + [f"{stem.rstrip('.')}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                target = name.split(".")[1] if name.startswith("factkernels.") else None
                if target and target != unit and ((package / target).is_dir() or (package / f"{target}.py").exists()):
                    edges.setdefault(unit, set()).add(target)
        edges.setdefault(unit, set())
    return edges


def test_readme_layout_names_every_module_and_points_down():
    block = README.split("## Layout", 1)[1].split("```", 2)[1]
    edges = _package_imports()
    row_of: dict = {}
    row = -1
    for line in block.splitlines():
        if not line.strip() or line.startswith("─"):
            continue
        row += not line.startswith(" ")
        for name in re.findall(r"\b(\w+)(?:\.py\b|/)", line):
            if name in edges:
                row_of.setdefault(name, row)
    assert sorted(set(edges) - set(row_of)) == [], "modules the README's layout does not name"
    upward = sorted(f"{unit} -> {target}" for unit, targets in edges.items() for target in targets
                    if row_of[target] < row_of[unit])
    assert not upward, f"imports that point up the README's layout: {upward}"
