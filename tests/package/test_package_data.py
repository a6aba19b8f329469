"""What the wheel ships besides the modules: the recipe's Hydra configs, all of them, where the
recipe composes them, and the marker of inline type hints. A config left in a ``conf/`` at the
repository root (a branch's new config group, which a merge does not move into the package) is
in no wheel, and ``mqgnn-train`` would not find it."""

from __future__ import annotations

import tomllib

from helpers.paths import CONF, REPO

PACKAGE = REPO / "lightning_mqgnn"


def package_data() -> list[str]:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-data"]["lightning_mqgnn"]


def test_no_configs_outside_the_package():
    assert not (REPO / "conf").exists(), "configs belong in lightning_mqgnn/conf: git mv conf/<group> there"


def test_every_config_is_package_data():
    configs = set(CONF.rglob("*.yaml"))
    shipped = {path for pattern in package_data() for path in PACKAGE.glob(pattern)}
    assert configs and not configs - shipped, sorted(str(p.relative_to(REPO)) for p in configs - shipped)
    assert PACKAGE / "py.typed" in shipped


def test_the_recipe_composes_the_package_configs():
    from hydra.utils import get_class
    from omegaconf import OmegaConf

    from lightning_mqgnn.recipe import CONF as RECIPE_CONF
    from lightning_mqgnn.recipe.summarize import SweepSummary

    assert CONF.resolve() == RECIPE_CONF
    target = OmegaConf.load(CONF / "config.yaml").hydra.callbacks.sweep_summary._target_
    assert get_class(target) is SweepSummary
