"""Every broken input the CLI reads, and every known run failure, is one `error:` line naming the
file (exit 1 or 2), never a traceback; `vla` alone shows help; an old Python or missing OpenGL
library says what to do."""

from __future__ import annotations

import pytest

from tests.faults import cli_trials as ct


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return ct.Inputs(tmp_path_factory.mktemp("inputs"))


QUICK = [(k, hows[0]) for k, (hows, _) in ct.CASES.items()]
SLOW = [pytest.param(k, h, marks=pytest.mark.slow) for k, (hows, _) in ct.CASES.items() for h in hows[1:]]


@pytest.mark.parametrize(("kind", "how"), QUICK + SLOW)
def test_broken_file_is_one_line_naming_it(inputs, tmp_path, kind, how):
    t = ct.bad_file_trial(inputs, kind, how, tmp_path)
    assert t.ok, t.detail


def test_full_disk_is_one_line(inputs, tmp_path):
    t = ct.disk_full_trial(inputs, tmp_path)
    assert t.ok, t.detail


def test_ctrl_c_is_one_line(inputs, tmp_path):
    t = ct.ctrl_c_trial(inputs, tmp_path)
    assert t.ok, t.detail


def test_training_diverged_is_one_line(inputs, tmp_path):
    t = ct.diverged_trial(inputs, tmp_path)
    assert t.ok, t.detail


def test_eval_worker_died_is_one_line(inputs, tmp_path):
    t = ct.eval_worker_died_trial(inputs, tmp_path)
    assert t.ok, t.detail


def test_unsupported_python_is_one_line():
    t = ct.old_python_trial()
    assert t.ok, t.detail


def test_no_arguments_shows_help():
    t = ct.no_args_trial()
    assert t.ok, t.detail


def test_traceback_escape_hatch(tmp_path, monkeypatch):
    from vlastack.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [\n")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        main(["--traceback", "info", "--config", str(bad)])
    monkeypatch.setenv("VLA_DEBUG", "1")
    with pytest.raises(ValueError, match=r"bad\.yaml"):
        main(["info", "--config", str(bad)])


@pytest.mark.slow
def test_nan_policy_through_vla_eval(tmp_path):
    t = ct.nan_eval_trial(tmp_path)
    assert t.ok, t.detail


@pytest.mark.slow
def test_missing_opengl_library_is_one_line(tmp_path):
    t = ct.missing_gl_trial(tmp_path)
    assert t.ok, t.detail


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [("--seed", "-5", "must be in [0, 4294967295], got -5"), ("--episodes", "0", "must be >= 1, got 0"),
     ("--temporal-ensemble", "nan", "must be >= 0.0"), ("--workers", "two", "expected an integer")],
)  # fmt: skip
def test_eval_values_are_checked_where_parsed(flag, value, says, capsys):
    """Issue #34 item 10: a bad value is one usage error naming the flag and the allowed range."""
    from vlastack.cli import main

    with pytest.raises(SystemExit) as e:
        main(["eval", "--policy", "random", flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}: {says}" in err and "Traceback" not in err


def test_eval_steps_per_chunk_above_the_chunk_is_refused(good_policy, capsys):
    from vlastack.cli import main

    rc = main(["eval", "--policy", str(good_policy), "--steps-per-chunk", "1000", "--episodes", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and "--steps-per-chunk 1000 is more than the policy's chunk length" in err, err
