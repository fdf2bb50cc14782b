"""The layers stay as drawn: import-linter's contracts hold, every service module sits in a
layer, and docs/architecture.md names every module of the four packages."""

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("contract", "engine", "runners", "service")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _contracts() -> list[dict]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["importlinter"]["contracts"]


def _layered_modules() -> set[str]:
    (layers,) = [c for c in _contracts() if c["type"] == "layers"]
    names = (layer.replace("|", ":").split(":") for layer in layers["layers"])
    return {name.strip() for group in names for name in group}


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py")


def test_import_linter_contracts_hold() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]


def test_every_service_module_is_in_a_layer() -> None:
    """A new module directly under service/ must be placed: an adapter, or the service core
    (pyproject.toml); otherwise the linter would never check what it imports."""
    layered = _layered_modules()
    children = {
        f"service.{p.stem if p.is_file() else p.name}"
        for p in (ROOT / "service").iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    }
    assert sorted(children - layered) == []


def test_no_function_level_import_of_an_adapter_from_below() -> None:
    """Lazy imports are seen by the linter too; this names the one way a cycle hid before
    (`service.web.install` imported the API's routes inside a function)."""
    offenders = []
    for path in _modules("service") + _modules("engine") + _modules("contract"):
        rel = path.relative_to(ROOT).with_suffix("")
        if rel.parts[:2] in (("service", "cli"), ("service", "example")):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            lazy = isinstance(node, ast.ImportFrom) and node.col_offset > 0 and node.module
            if lazy and node.module.startswith(("service.cli", "service.app")):
                offenders.append(f"{rel}: {node.module}")
    assert offenders == []


def test_architecture_names_every_module() -> None:
    """docs/architecture.md is the map: a module it does not name is a module nobody finds."""
    text = ARCHITECTURE.read_text()
    missing = []
    for package in PACKAGES:
        for path in _modules(package):
            rel = path.relative_to(ROOT)
            folder = f"{rel.parent.as_posix()}/"
            if rel.as_posix() in text or (folder in text and f"`{path.name}`" in text):
                continue
            missing.append(rel.as_posix())
    assert missing == [], "name these in docs/architecture.md"
