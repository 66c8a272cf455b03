"""The head contract (issue #36), run over every registered head: a new head is tested by adding
its ``HEAD_SPECS`` entry. Each head, plain and with the grounding add-on where its spec has one,
trains a few steps (every scalar it returns logged), saves and loads back to the same sampler, acts
through ``Policy`` and the server, exports where it can, and goes through ``vla plan`` and
``vla info``. Capabilities come from the spec; nothing asks for a head by name."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from tests.train.train_helpers import FakeDataset, tiny_cfg
from vlastack.batch import dummy_batch
from vlastack.config import HEAD_SPECS, model_config_from_dict, to_dict
from vlastack.models.vla import VLA

CASES = [(name, False) for name in HEAD_SPECS] + [(n, True) for n, sp in HEAD_SPECS.items() if sp.grounded]
# Options a head needs beside model.head=<name> for the grounding add-on (a config-time rule).
GROUNDED_EXTRA = {"tokens": ["model.tokens.state_input=continuous"]}


def _overrides(name: str, grounded: bool) -> list[str]:
    over = [f"model.head={name}", "train.steps=2", "train.save_every=100", "model.num_denoise_steps=2"]
    return over + (["model.grounding.points=2", *GROUNDED_EXTRA.get(name, [])] if grounded else [])


def _obs(cfg, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    size = cfg.model.vision.image_size
    return {
        "images": {cfg.model.camera_names[0]: rng.integers(0, 256, (size, size, 3), dtype=np.uint8)},
        "state": rng.standard_normal(cfg.model.state_dim).astype(np.float32),
        "prompt": "pick up the red cube",
    }


@pytest.fixture(scope="module", params=CASES, ids=[f"{n}{'+grounding' if g else ''}" for n, g in CASES])
def trained(request, tmp_path_factory):
    from vlastack.train.trainer import Trainer

    name, grounded = request.param
    cfg = tiny_cfg(*_overrides(name, grounded))
    run = tmp_path_factory.mktemp(f"head_{name}")
    tr = Trainer(cfg, run_dir=run, dataset=FakeDataset(cfg))  # grounding targets included
    out = tr.fit()
    return cfg, run, tr, out


def test_trains_and_logs_every_scalar(trained):
    cfg, run, tr, out = trained
    assert out["steps"] == 2 and all(np.isfinite(out["losses"]))
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    last = next(r for r in reversed(recs) if "train/loss" in r)
    batch = dummy_batch(cfg.model, 2)
    with torch.no_grad():
        scalars = [k for k, v in tr.model(batch).items() if v.ndim == 0]
    assert {f"train/{k}" for k in scalars} <= set(last), (scalars, sorted(last))


def test_save_load_round_trip_samples_the_same(trained):
    cfg, run, tr, _ = trained
    loaded = VLA.from_pretrained(run / "final").eval()
    tr.model.eval()
    batch = dummy_batch(cfg.model, 2, train=False)
    noise = torch.randn(
        2, cfg.model.action_horizon, cfg.model.action_dim, generator=torch.Generator().manual_seed(0)
    )
    kw = {"generator": torch.Generator().manual_seed(3)} if cfg.model.head_spec.seeded_sampling else {}
    a = loaded.sample(batch, noise=noise, **kw).actions
    kw = {"generator": torch.Generator().manual_seed(3)} if cfg.model.head_spec.seeded_sampling else {}
    torch.testing.assert_close(a, tr.model.sample(batch, noise=noise, **kw).actions)
    # The saved config keeps only this head's options, and reads back as the same model.
    saved = json.loads((run / "final" / "config.json").read_text())["model"]
    assert not set(saved) & cfg.model.foreign_keys
    assert to_dict(model_config_from_dict(saved)) == to_dict(cfg.model)


def test_policy_and_server(trained):
    from vlastack.infer.policy import Policy
    from vlastack.infer.server import PolicyServer, ServerThread

    cfg, run, _, _ = trained
    policy = Policy.from_pretrained(run / "final", seed=0)
    h, a = cfg.model.action_horizon, policy.action_dim
    assert policy.infer(_obs(cfg))["actions"].shape == (h, a)
    md = policy.metadata
    assert md["rtc_methods"] == ([] if not cfg.model.head_spec.denoise else md["rtc_methods"])
    with ServerThread(PolicyServer(policy, port=0)) as srv:
        out = WebsocketClientPolicy("127.0.0.1", srv.port).infer(_obs(cfg, 1))
    assert out["actions"].shape == (h, a)


def test_export_where_the_head_can(trained, tmp_path):
    from vlastack.infer.export import export_policy
    from vlastack.infer.export_lerobot import export_lerobot
    from vlastack.infer.policy import Policy

    cfg, run, _, _ = trained
    policy = Policy.from_pretrained(run / "final", seed=0)
    try:
        policy.model.head.check_exportable()
    except ValueError:
        pytest.skip("this head's options declare it not exportable")  # refused with its reason
    side = export_policy(policy, "torchscript", tmp_path / "ts")
    assert side["check"]["passed"]
    if cfg.model.head_spec.export_lerobot and not cfg.model.grounding.points:
        assert (export_lerobot(run / "final", tmp_path / "lerobot") / "model.safetensors").exists()
    else:
        with pytest.raises(ValueError, match="LeRobot equivalent"):
            export_lerobot(run / "final", tmp_path / "lerobot")


def test_plan_and_info(trained, capsys):
    from vlastack.cli import main
    from vlastack.diagnostics.plan import simulate

    cfg, _, _, _ = trained
    for mode in ("train", "infer"):
        assert simulate(cfg, batch_size=2, mode=mode)["peak_bytes"] > 0
    over = _overrides(cfg.model.head, bool(cfg.model.grounding.points))
    assert main(["info", "--preset", "tiny", *over]) == 0
    text = capsys.readouterr().out
    assert ("suffix tokens" in text) == cfg.model.head_spec.uses_expert


def test_no_head_name_branch_outside_the_registry():
    """Code asks the spec for a capability, never for a head by name (nor probes with hasattr)."""
    root = Path(__file__).resolve().parents[2] / "vlastack"
    branch = re.compile(
        r"""\bhead\s*[!=]=\s*["']|hasattr\([^)]*head[^)]*["'](denoise_step|predict_grounding)"""
    )
    found = [
        f"{p.relative_to(root)}:{i}"
        for p in root.rglob("*.py")
        if p.parent.name != "heads" and p.name != "heads.py"
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if branch.search(line)
    ]
    assert not found, found


@pytest.mark.parametrize(
    "golden", sorted((Path(__file__).parents[1] / "fixtures" / "configs").glob("*.json"))
)
def test_checkpoint_configs_saved_before_the_spec_registry_still_load(golden):
    """config.json files written before per-head options (every head and variant, with other heads'
    options in them) load as the same model; saved again, they keep only their head's options."""
    data = json.loads(golden.read_text())
    cfg = model_config_from_dict(data)

    def known(new, old):  # ``new`` restricted to the keys ``old`` has (later keys have defaults)
        return {k: known(v, old[k]) for k, v in new.items() if k in old} if isinstance(new, dict) else new

    saved = to_dict(cfg)
    assert not set(saved) & cfg.foreign_keys and set(saved) <= set(data)
    assert known(saved, data) == {k: v for k, v in data.items() if k in saved}
    assert to_dict(model_config_from_dict(saved)) == saved
