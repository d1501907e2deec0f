"""README.md's shell commands name real entry points and pass their argument parsers (read at test
time, so README edits are checked). Running them at toy size: `python -m tests.readme_commands --run`
(the demo's toy run is what tests/test_teleop.py runs end to end)."""

from __future__ import annotations

import pytest

from rynn_jax import errors
from tests import readme_commands


def test_readme_commands_parse():
    results = readme_commands.check()
    parsed = [c for c, outcome in results if outcome == "parsed"]
    assert any(c.startswith("python3 serve.py demo") for c in parsed), results
    assert all(outcome == "parsed" or outcome.startswith("skipped") for _, outcome in results), results


def test_the_checker_catches_drift(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\n# a comment\npython serve.py demo \\\n    --world sim && python train.py --config "
                      "configs/tiny.py --set total_steps=3\n./setup.sh\n```\n")
    assert [c for c, _ in readme_commands.check(str(readme))] == [
        "python serve.py demo --world sim", "python train.py --config configs/tiny.py --set total_steps=3",
        "./setup.sh"]
    readme.write_text("```bash\npython serve.py demo --world moon\n```\n")
    with pytest.raises(errors.UsageError, match="--world: invalid choice: 'moon'"):
        readme_commands.check(str(readme))
    readme.write_text("```bash\npython serve.py demo --fast\n```\n")
    with pytest.raises(errors.UsageError, match="unrecognized arguments: --fast"):
        readme_commands.check(str(readme))
    readme.write_text("```bash\npython bake.py\n```\n")
    with pytest.raises(AssertionError, match="bake.py, which is not an entry point"):
        readme_commands.check(str(readme))
