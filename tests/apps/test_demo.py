"""`vla demo`: the packaged recipe and the measured precision choice."""

from __future__ import annotations

import pytest

from vlastack.apps.demo import demo_config, explicit_precision, pick_precision, recipe
from vlastack.config import load_config
from vlastack.train.precision import choose_precision, matmul_shapes, measure

SHAPES = [(64, 32, 48)]


def test_demo_recipe_is_the_packaged_yaml():
    """One recipe: `vla demo`'s config is `vla train --config demo` (vlastack/configs/demo.yaml)."""
    assert demo_config() == load_config("tiny", "demo")
    fp32 = demo_config(precision="fp32")
    assert fp32.train.precision == "fp32"
    assert fp32.model == demo_config().model and fp32.eval == demo_config().eval
    assert recipe("fp32")["train"]["steps"] == fp32.train.steps


@pytest.mark.parametrize(
    ("fp32_s", "bf16_s", "want"),
    [(1.0, 0.5, "bf16"), (1.0, 46.0, "fp32"), (1.0, 0.9, "fp32"), (1.0, 1.0, "fp32")],
)
def test_chooser_picks_by_measured_ratio(fp32_s, bf16_s, want):
    seen = []

    def timer(shapes):
        seen.append(shapes)
        return fp32_s, bf16_s

    c = choose_precision(SHAPES, "cpu", timer=timer)
    assert seen == [SHAPES]
    assert c.precision == want
    assert c.ratio == pytest.approx(bf16_s / fp32_s)
    assert c.reason.startswith(f"{want}: ") and f"{bf16_s / fp32_s:.2f}x" in c.reason


def test_explicit_precision_wins_and_picks_its_recipe():
    never = pytest.fail  # the timer must not run when the user chose

    prec, why = pick_precision("tiny", None, ["train.precision=bf16"], "cpu", timer=never)
    assert (prec, why) == ("bf16", "bf16: train.precision=bf16 was given")
    assert explicit_precision(None, ["train.steps=5", "train.precision=fp32"]) == "fp32"
    assert explicit_precision(None, ["train.steps=5"]) is None
    prec, _ = pick_precision("tiny", None, [], "cpu", timer=lambda s: (1.0, 30.0))
    assert prec == "fp32"
    assert demo_config(precision=prec).train.steps == recipe("fp32")["train"]["steps"]


def test_measure_runs_on_the_demo_shapes():
    shapes = matmul_shapes(demo_config().model, 32)
    assert all(m <= 1024 for m, _, _ in shapes)
    fp32_s, bf16_s = measure(SHAPES, budget_s=0.2, reps=2)
    assert fp32_s > 0 and bf16_s > 0


def test_library_layers_do_not_import_apps():
    """Applications sit above the library: only vlastack/cli.py (the entry point) names them."""
    import ast
    from pathlib import Path

    root = Path(__file__).parents[2] / "vlastack"
    offenders = []
    for path in root.rglob("*.py"):
        if path.parts[-2] == "apps" or (path.name == "cli.py" and path.parent == root):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n.startswith("vlastack.apps")]
    assert offenders == []
