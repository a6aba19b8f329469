"""Lightning idioms: every overridden hook carries ``@override``, and the private Lightning and
torch APIs the package uses are exactly those listed, with their reasons, in ``_private_api``."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import pkgutil
import textwrap
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.strategies import Strategy

import lightning_mqgnn
from lightning_mqgnn._private_api import PRIVATE_APIS

ROOT = Path(lightning_mqgnn.__file__).parent
LIGHTNING_MODULE_NAMES = ("model", "module", "pl_module", "lightning_module")
LIGHTNING_BASES = (pl.Callback, pl.LightningModule, pl.LightningDataModule, Strategy)
LIGHTNING_MODULE = "lightning.pytorch.core.module.LightningModule"
TRAINER = "lightning.pytorch.trainer.trainer.Trainer"


def package_modules():
    for info in pkgutil.walk_packages([str(ROOT)], prefix="lightning_mqgnn."):
        try:
            yield importlib.import_module(info.name)
        except ImportError:  # optional dependency (DGL) missing: nothing of Lightning's in there
            continue


def lightning_classes():
    """Every class the package defines on a Lightning base (callback, module, DataModule, strategy)."""
    for module in package_modules():
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, LIGHTNING_BASES):
                yield cls


def test_every_overridden_lightning_hook_says_override():
    missing, checked = [], 0
    for cls in lightning_classes():
        for name, attr in vars(cls).items():
            if name in ("__init__", "__init_subclass__") or not callable(getattr(attr, "__func__", attr)):
                continue
            if any(name in vars(base) for base in cls.__mro__[1:] if base is not object):
                checked += 1
                if not getattr(getattr(attr, "__func__", attr), "__override__", False):
                    missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert checked > 30
    assert missing == [], f"hooks without @override: {missing}"


def is_external(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in ("torch", "lightning")


def private_uses() -> set[str]:
    """``root.path._name`` for every private torch/lightning name a module imports or reads."""
    found = set()
    for path in ROOT.rglob("*.py"):
        if path.name == "_private_api.py":
            continue
        tree = ast.parse(path.read_text())
        aliases = {}  # local name -> dotted torch/lightning path
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if is_external(a.name):
                        aliases[a.asname or a.name.split(".")[0]] = (
                            a.name if a.asname else a.name.split(".")[0]
                        )
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and is_external(node.module):
                for a in node.names:
                    if a.name.startswith("_"):
                        found.add(f"{node.module}.{a.name}")
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        for node in ast.walk(tree):
            if (  # getattr(model, "_trainer"): a private attribute of a LightningModule
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "getattr"
                and getattr(node.args[0], "id", None) in LIGHTNING_MODULE_NAMES
                and isinstance(node.args[1], ast.Constant)
                and str(node.args[1].value).startswith("_")
            ):
                found.add(f"{LIGHTNING_MODULE}.{node.args[1].value}")
            if (  # a private LightningModule attribute named by a string constant
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value in lightning_module_private_attributes()
            ):
                found.add(f"{LIGHTNING_MODULE}.{node.value}")
            if (  # model._trainer: the same, read directly
                isinstance(node, ast.Attribute)
                and getattr(node.value, "id", None) in LIGHTNING_MODULE_NAMES
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.add(f"{LIGHTNING_MODULE}.{node.attr}")
            if (  # trainer._x: a private attribute of Lightning's Trainer
                isinstance(node, ast.Attribute)
                and getattr(node.value, "id", None) == "trainer"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.add(f"{TRAINER}.{node.attr}")
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                chain, value = [node.attr], node.value
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    found.add(".".join([aliases[value.id], *reversed(chain)]))
    return found | inherited_private_uses()


@functools.cache
def lightning_module_private_attributes() -> set[str]:
    """The private attributes ``LightningModule`` assigns to itself (``self._x = ...``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(pl.LightningModule)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and getattr(node.value, "id", None) == "self"
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    }


def names_defined_here() -> set[str]:
    """Every attribute the package itself assigns (``self._x = ...``) or defines in a class body."""
    names = set()
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(item.name)
                    elif isinstance(item, ast.Assign | ast.AnnAssign):
                        targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def inherited_private_uses() -> set[str]:
    """``module.Base._x`` for every private attribute that a package class deriving from a
    Lightning class reads through ``self`` without defining it: it belongs to ``Base``."""
    ours, found = names_defined_here(), set()
    for cls in lightning_classes():
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(cls)))):
            if (
                isinstance(node, ast.Attribute)
                and getattr(node.value, "id", None) == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and node.attr not in ours
            ):
                owner = next(
                    base
                    for base in cls.__mro__[1:]
                    if is_external(base.__module__)
                    and (node.attr in vars(base) or f"self.{node.attr}" in inspect.getsource(base))
                )
                found.add(f"{owner.__module__}.{owner.__qualname__}.{node.attr}")
    return found


def test_private_apis_in_use_are_exactly_the_listed_ones():
    assert private_uses() == set(PRIVATE_APIS)
    assert all(len(why) > 40 for why in PRIVATE_APIS.values())
