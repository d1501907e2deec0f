"""Every recipe under configs/ builds its config — at its default and at every `configs/X.py:ARG`
variant the repository's docs, scripts and recipes name — so a renamed field or a stale variant in
a doc fails here rather than at the start of a GPU lease."""

import dataclasses
import pathlib
import re

import pytest

from rynn_jax.training import config as config_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "configs").glob("*.py") if "def get_config" in p.read_text())
_NAMED = re.compile(r"configs/([a-z0-9_]+)\.py:([A-Za-z0-9_]+(?:,[A-Za-z0-9_]+)*)")


def named_variants() -> list[tuple[str, str]]:
    """(recipe stem, ARG) pairs written anywhere in the repository's text (placeholders like N skipped)."""
    found = set()
    for path in [*ROOT.glob("*.md"), *ROOT.glob("*.py"), *(ROOT / "docs").rglob("*.md"), *(ROOT / "configs").glob("*.py"),
                 *(ROOT / "scripts").rglob("*.sh"), *(ROOT / "rynn_jax").rglob("*.py")]:
        for stem, arg in _NAMED.findall(path.read_text(errors="replace")):
            if arg != "N":
                found.add((stem, arg))
    return sorted(found)


def test_the_recipe_list_is_not_empty():
    assert len(RECIPES) >= 20, [p.name for p in RECIPES]
    assert len(named_variants()) >= 10


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_builds_its_default_config(path):
    cfg = config_lib.run_recipe(path, object)
    assert dataclasses.is_dataclass(cfg) and not isinstance(cfg, type), type(cfg)
    assert cfg.total_steps >= 1


@pytest.mark.parametrize("stem,arg", named_variants(), ids=lambda x: str(x))
def test_every_variant_the_repository_names_builds(stem, arg):
    path = ROOT / "configs" / f"{stem}.py"
    assert path.is_file(), f"configs/{stem}.py:{arg} is named but configs/{stem}.py does not exist"
    cfg = config_lib.run_recipe(path, object, arg)
    assert dataclasses.is_dataclass(cfg)


def test_a_variant_a_recipe_does_not_have_is_refused():
    with pytest.raises((ValueError, KeyError)):
        config_lib.run_recipe(ROOT / "configs" / "policy.py", object, "no_such_encoder")


def test_autoencoder_recipes_continuing_the_committed_one_match_its_architecture():
    """A recipe that continues the committed autoencoder (`ckpt.init_from`) states its widths: the
    trainer refuses an export of another architecture, so a mismatch here would only show on a GPU."""
    from configs import synthetic
    from rynn_jax import converted_weights
    from rynn_jax.models.vae import WanVAEConfig
    from rynn_jax.training.autoencoder import architecture  # what the trainer compares

    committed = architecture(converted_weights.load_config(ROOT / synthetic.AUTOENCODER, WanVAEConfig))
    checked = []
    for stem, arg in [(p.stem, "") for p in RECIPES] + named_variants():
        cfg = config_lib.run_recipe(ROOT / "configs" / f"{stem}.py", object, arg)
        model = getattr(cfg, "model", None)
        if isinstance(model, WanVAEConfig) and cfg.ckpt.init_from == synthetic.AUTOENCODER:
            assert architecture(model) == committed, f"configs/{stem}.py:{arg}"
            checked.append(f"{stem}:{arg}")
    assert len(checked) >= 2, checked  # synthetic_ae.py:wide, synthetic_ae4d.py
