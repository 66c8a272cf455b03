"""The README's commands, run (doc-test style), so the user's guide cannot rot.

Every line of the README's ```bash blocks must match a rule in ``RULES``, which says how this test
exercises it:

- ``vla ...`` commands run as written through ``vlastack.cli.main`` (the ``vla`` entry point) in a
  temporary folder, with options that shrink the work set by the rule (fewer episodes, in-process
  workers) and, for ``vla train``, overrides appended that cut the model to one layer per part and
  the run to 2 steps; ``vla serve`` runs as a subprocess on an ephemeral port.
- ``make demo``, ``make test`` and ``source .venv/bin/activate`` are checked against the Makefile,
  the CI entry point and the setup script (``make -n``) instead of being run.

Every ```python block is executed (after all bash commands, in README order, in one namespace, while
the README's ``vla serve`` is up; its port 8000 becomes the ephemeral one). A bash command that no
rule covers fails ``test_every_readme_command_is_covered`` (cheap, always on), so a new README
command needs a rule here, and then it is run.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vlastack.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# The tiny preset cut to one layer per part, patch 16 and 2 denoising steps: the same code paths,
# a fraction of the cost (training, serving and export all use the trained policy's config).
MICRO = (
    "model.vision.patch_size=16", "model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1",
    "model.head_options.num_denoise_steps=2", "train.batch_size=8", "train.steps=2", "train.log_every=1",
    "train.save_every=1000", "data.num_workers=0", "train.num_threads=2",
)  # fmt: skip

# A token head has no denoising steps (its options are its own: model.head_options).
MICRO_TOKENS = tuple(o for o in MICRO if "num_denoise_steps" not in o)

FINE_TUNE_MICRO = (
    "train.batch_size=2", "train.steps=2", "train.log_every=1", "train.save_every=1000",
    "train.precision=fp32", "data.num_workers=0", "train.num_threads=2", "train.preload=false",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Rule:
    """How the test runs README commands starting with ``prefix``."""

    prefix: tuple[str, ...]
    kind: str = "vla"  # vla | serve | make | venv
    set_opts: tuple[tuple[str, str], ...] = ()  # option -> value, replaced or added
    append: tuple[str, ...] = ()  # dotted overrides appended (the last one wins)
    prepend: tuple[str, ...] = ()  # whole options put first, e.g. "--set=KEY=VALUE"


RULES = (
    Rule(("make", "demo"), kind="make"),
    Rule(("make", "test"), kind="make"),
    Rule(("source", ".venv/bin/activate"), kind="venv"),
    Rule(("vla", "data", "generate"), set_opts=(("--episodes", "4"), ("--workers", "0"))),
    Rule(("vla", "data", "info")),
    Rule(("vla", "data", "view")),
    Rule(("vla", "train"), append=MICRO),
    Rule(("vla", "train", "--config", "demo_tokens"), append=MICRO_TOKENS),
    # One iteration of two rollouts of a few steps: the loop, the update and final/ all run.
    Rule(("vla", "rl"), append=("rl.iterations=1", "rl.groups=1", "rl.group_size=2", "eval.max_steps=3")),
    Rule(("vla", "recap", "collect"), set_opts=(("--episodes-per-task", "1"),)),
    Rule(("vla", "info")),
    Rule(("vla", "eval"), set_opts=(("--episodes", "2"), ("--workers", "0"), ("--videos", "0"))),
    Rule(("vla", "serve"), kind="serve", set_opts=(("--port", "0"),)),
    Rule(("vla", "export")),
    Rule(("vla", "import-hf"), set_opts=(("--paligemma", "{paligemma}"),)),
    Rule(("vla", "data", "check")),
    # The Hub id resolves in a Hugging Face cache the test fills with lerobot's tiny pi05 fixture,
    # whose head count its tensors cannot tell (a real checkpoint's variant names do).
    Rule(("vla", "import"), prepend=("--set=model.vision.heads=4",)),
    # Fine-tuning the imported checkpoint (its config as imported, the run cut to 2 steps).
    Rule(("vla", "train", "--config", "runs/pi05_base/train.yaml"), append=FINE_TUNE_MICRO),
    Rule(("vla", "export-lerobot")),
    Rule(("vla", "doctor"), set_opts=(("--steps", "2"), ("--warmup", "1"), ("--profile-steps", "1"))),
    Rule(("vla", "plan")),
    Rule(("vla", "lab", "list")),
    Rule(("vla", "lab", "run")),
)

LEROBOT_PI05 = ROOT / "tests/fixtures/lerobot/pi05"


def readme_blocks(text: str | None = None) -> list[tuple[str, str]]:
    """(language, body) of every fenced block, in order."""
    text = README.read_text() if text is None else text
    return [(m[1], m[2]) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S)]


def bash_commands(body: str) -> list[list[str]]:
    """A bash block's commands as argv lists: continuation lines joined, comments dropped."""
    cmds = []
    for line in body.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            cmds.append(argv)
    return cmds


def rule_for(argv: list[str]) -> Rule | None:
    matches = [r for r in RULES if tuple(argv[: len(r.prefix)]) == r.prefix]
    return max(matches, key=lambda r: len(r.prefix), default=None)


def adapt(argv: list[str], rule: Rule, **fill: str) -> list[str]:
    """The README's argv with the rule's options set and its overrides appended (``vla`` dropped)."""
    head, rest = list(rule.prefix[1:]), list(argv[len(rule.prefix) :])
    for opt, value in rule.set_opts:
        value = value.format(**fill)
        if opt in rest:
            rest[rest.index(opt) + 1] = value
        else:
            rest = [opt, value, *rest]
    rest = [*rule.prepend, *rest]
    # Options first, dotted overrides last: argparse takes one run of positional overrides.
    opts = [a for a in rest if a.startswith("-") or "=" not in a]
    overrides = [a for a in rest if not a.startswith("-") and "=" in a]
    return [*head, *opts, *overrides, *rule.append]


def make_dry_run(target: str) -> str:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    out = subprocess.run(["make", "-n", "-C", str(ROOT), target], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def check_structural(argv: list[str], rule: Rule) -> None:
    """What the README says about commands that set up or run everything, checked without running."""
    if rule.kind == "venv":
        setup = (ROOT / "scripts/setup.sh").read_text()
        assert "VENV=${VENV:-.venv}" in setup and '-m venv "$VENV"' in setup
        assert 'vla = "vlastack.cli:main"' in (ROOT / "pyproject.toml").read_text()
        return
    assert len(argv) == 2, f"`{shlex.join(argv)}`: only the bare make targets are covered"
    steps = make_dry_run(argv[1])
    assert "scripts/setup.sh" in steps, f"`make {argv[1]}` must set up .venv first"
    if argv[1] == "demo":
        assert re.search(r"(-m vlastack\.cli|\bvla) demo\b", steps), steps
    else:  # lint + tests, and what CI runs
        for part in ("ruff check", "ruff format --check", "pytest"):
            assert part in steps, f"`make test` does not run {part}:\n{steps}"
        ci = (ROOT / ".ci/run").read_text()
        # CI runs the default suite and the end-to-end tier it leaves out (marker `integration`).
        assert "make test\n" in ci and "make test-integration" in ci


def test_every_readme_command_is_covered(monkeypatch):
    """Each bash command has a rule, its flags parse with the real CLI and its config builds."""
    from vlastack.commands.common import config_from_args

    monkeypatch.chdir(ROOT)  # --config paths in the README are relative to the repository root

    cmds = [c for lang, body in readme_blocks() if lang == "bash" for c in bash_commands(body)]
    assert cmds, "no ```bash blocks found in README.md"
    uncovered = [shlex.join(c) for c in cmds if rule_for(c) is None]
    assert not uncovered, f"README commands without a rule in tests/test_readme.py: {uncovered}"
    parser = build_parser()
    for argv in cmds:
        rule = rule_for(argv)
        if rule.kind in ("make", "venv"):
            check_structural(argv, rule)
            continue
        for args in (argv[1:], adapt(argv, rule, paligemma="pg")):
            try:
                ns = parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"`{shlex.join(argv)}` does not parse as {args}")
            made_earlier = str(getattr(ns, "config", "") or "").startswith("runs/")  # by a README command
            # `vla rl` builds its config on the policy folder's, which a README command makes first.
            if hasattr(ns, "overrides") and hasattr(ns, "preset") and not made_earlier:
                config_from_args(ns)
    langs = {lang for lang, _ in readme_blocks()}
    assert langs <= {"bash", "python"}, f"unexpected code block languages {langs - {'bash', 'python'}}"


class Server:
    """``vla serve`` in a subprocess; its log goes to a file that is polled for the bound port."""

    def __init__(self, args: list[str], cwd: Path):
        self.log = cwd / "serve.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "vlastack.cli", *args], cwd=cwd, env=env, stdout=f, stderr=f
            )
        self.port: int | None = None

    def wait_ready(self, timeout: float = 120.0) -> int:
        deadline = time.monotonic() + timeout
        while self.port is None:
            m = re.search(r"serving ws://[\w.]+:(\d+)", self.log.read_text())
            if m:
                self.port = int(m[1])
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"vla serve did not start:\n{self.log.read_text()}")
            else:
                time.sleep(0.1)
        return self.port

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # drains and exits 0
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.mark.integration
def test_readme_commands_run(tmp_path, monkeypatch):
    """Every README command and snippet, in order, in a fresh folder (~30-60 s on 2 cores)."""
    monkeypatch.chdir(tmp_path)
    snap = tmp_path / "hub/models--lerobot--pi05_base/snapshots/fixture"
    shutil.copytree(LEROBOT_PI05, snap, ignore=shutil.ignore_patterns("io.*", "export_io.*"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # for `vla import lerobot/pi05_base`
    blocks = readme_blocks()
    server: Server | None = None
    try:
        for lang, body in blocks:
            if lang != "bash":
                continue
            for argv in bash_commands(body):
                rule = rule_for(argv)
                assert rule is not None, shlex.join(argv)
                if rule.kind in ("make", "venv"):
                    check_structural(argv, rule)
                    continue
                fill = {}
                if rule.prefix == ("vla", "import-hf"):
                    fill["paligemma"] = str(_paligemma_folder(tmp_path))
                args = adapt(argv, rule, **fill)
                if rule.kind == "serve":
                    assert server is None, "one `vla serve` per README"
                    server = Server(args, tmp_path)
                    continue
                assert main(args) == 0, f"`{shlex.join(argv)}` failed (run as {args})"
        _check_outputs(tmp_path)
        namespace: dict = {}
        for lang, body in blocks:
            if lang == "python":
                if "8000" in body:
                    assert server is not None, "a snippet talks to a server the README does not start"
                    body = body.replace("8000", str(server.wait_ready()))
                namespace.pop("actions", None)
                exec(compile(body, "README.md", "exec"), namespace)
                if "actions" in namespace:  # what the README says the snippets return
                    acts = namespace["actions"]
                    assert acts.shape == (16, 4) and str(acts.dtype) == "float32", (acts.shape, acts.dtype)
    finally:
        rc = server.stop() if server is not None else 0
    assert rc == 0, f"vla serve did not exit cleanly on SIGTERM:\n{server.log.read_text()}"


def _paligemma_folder(tmp_path: Path) -> Path:
    """A small Hugging Face PaliGemma folder: the trained policy's VLM, written as `vla export-hf` does."""
    from vlastack.models.hf import export_paligemma
    from vlastack.models.vla import VLA

    folder = tmp_path / "paligemma"
    policies = sorted(tmp_path.glob("runs/*/final/model.safetensors"))
    assert policies, "the README trains a policy before importing PaliGemma"
    export_paligemma(VLA.from_pretrained(policies[0].parent), folder)
    return folder


def _check_outputs(tmp_path: Path) -> None:
    """The files the README says the commands write."""
    for lang, body in readme_blocks():
        for argv in bash_commands(body) if lang == "bash" else ():
            if "--out" in argv:
                out = argv[argv.index("--out") + 1]
                assert (tmp_path / out).exists(), f"`{shlex.join(argv)}` did not write {out}"
    run = tmp_path / "runs/mine"
    for name in ("final/model.safetensors", "final/config.json", "final/norm_stats.json", "checkpoints",
                 "metrics.jsonl", "loss_curve.png", "tb", "eval/eval.json", "eval/eval.png"):  # fmt: skip
        assert (run / name).exists(), f"the README says the run folder holds {name}"
