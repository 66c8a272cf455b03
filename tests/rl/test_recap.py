"""RECAP (``vla recap``, rl/recap.py): the indicator reaches the prompt in training and serving,
the value's advantage is held out by episode, and collect -> label writes a dataset the ordinary
trainer reads, with every source's episodes and frames."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from vlastack.config import load_config, load_yaml, save_yaml
from vlastack.data.reader import LeRobotDataset
from vlastack.data.samples import ADVANTAGE_KEY, VLADataset
from vlastack.infer.policy import Policy
from vlastack.models import build_model
from vlastack.models.prompt import ADVANTAGE_TEXT, tokenize_prompt
from vlastack.models.tokenizer import load_tokenizer
from vlastack.rl.recap import collect, cross_fit_values, indicators, label, returns
from vlastack.sim.generate import generate, merge_datasets

TASK = "move the green block onto the pad"


def _text(tok, ids, mask) -> str:
    return tok.decode([int(i) for i in ids[mask]])


def test_the_indicator_ends_the_prompt_and_is_never_cut():
    tok = load_tokenizer("byte")
    tail = 1 + len(ADVANTAGE_TEXT[True])  # "\nAdvantage: positive\n"
    plain_ids, _ = tokenize_prompt(tok, TASK, None, 24, False)
    ids, mask = tokenize_prompt(tok, TASK, None, 24 + tail, False, advantage=True)
    # the start's 24 tokens of the instruction (cut mid-word), then the indicator on its line
    assert (ids[:24] == plain_ids).all() and mask.sum() == 24 + tail
    assert _text(tok, ids, mask) == "move the green block on\nAdvantage: positive\n"
    short_ids, short_mask = tokenize_prompt(tok, TASK, None, 30, False, advantage=False)
    assert _text(tok, short_ids, short_mask).endswith("Advantage: negative\n")
    long_ids, long_mask = tokenize_prompt(tok, TASK, None, 80, False, advantage=True)
    assert _text(tok, long_ids, long_mask).startswith(TASK + "\nAdvantage: positive")
    pi05_ids, pi05_mask = tokenize_prompt(tok, TASK, np.zeros(3), 120, True, advantage=False)
    assert "\nAdvantage: negative\nAction: " in _text(tok, pi05_ids, pi05_mask)
    with pytest.raises(ValueError, match="cannot hold the advantage"):
        tokenize_prompt(tok, TASK, None, tail, False, advantage=True)


def test_returns_and_per_task_thresholds():
    succ = np.array([0, 0, 1, 0, 0, 0], bool)  # a 3-frame success, then a 3-frame failure
    np.testing.assert_allclose(returns(succ, [3, 3], 0.5), [0.25, 0.5, 1.0, 0, 0, 0])
    adv = np.array([0.1, 0.2, 0.3, 0.4, -1.0, -2.0, -3.0, -4.0])
    task = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    got = indicators(adv, task, 0.25)  # the top quarter of each task, whatever its scale
    assert got.tolist() == [False, False, False, True, True, False, False, False]
    with pytest.raises(ValueError, match="positive_fraction"):
        indicators(adv, task, 1.0)


def test_a_frames_value_never_saw_its_episode():
    rng = np.random.default_rng(0)
    episode = np.repeat(np.arange(20), 10)
    x = rng.normal(size=(200, 6)).astype(np.float32)
    y = rng.uniform(size=200).astype(np.float32)
    v, fit = cross_fit_values(x, y, episode, folds=2, seed=0, epochs=2, batch=32)
    y2 = y.copy()
    y2[episode == 3] = 1.0 - y2[episode == 3]  # another label for one episode
    v2, _ = cross_fit_values(x, y2, episode, folds=2, seed=0, epochs=2, batch=32)
    np.testing.assert_array_equal(v[episode == 3], v2[episode == 3])  # its own values: unchanged
    assert not np.array_equal(v, v2)  # the other fold's did learn from it
    assert set(fit) == {"bce_heldout", "bce_constant"}


@pytest.fixture(scope="module")
def micro_policy(tmp_path_factory):
    """A one-layer flow policy for the built-in suite (state 5, action 4, the scene camera)."""
    over = ["model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.vision.patch_size=16",
            "model.head_options.num_denoise_steps=2", "model.state_dim=5", "model.action_dim=4",
            "model.camera_names=[scene]"]  # fmt: skip
    mcfg = load_config("tiny", None, over).model
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("recap") / "policy"
    build_model(mcfg).save_pretrained(path)
    cfg = load_config("tiny")
    cfg = replace(
        cfg, model=mcfg, eval=replace(cfg.eval, steps_per_chunk=2, max_steps=6, tasks=("reach", "push"))
    )
    save_yaml(cfg, path / "config.yaml")
    return path


def test_collect_then_label_writes_what_the_trainer_reads(micro_policy, tmp_path):
    demos = tmp_path / "demos"
    generate(demos, tasks=("reach", "push"), episodes=4, workers=0, seed=0, progress=False, resumable=False,
             video_quality="lossless")  # fmt: skip
    rollouts = tmp_path / "rollouts"
    rates = collect(micro_policy, rollouts, 3, batch_episodes=4, progress=False)
    assert set(rates) == {"reach", "push"}
    meta = json.loads((rollouts / "meta" / "recap_rollouts.json").read_text())
    assert [e["seed"] for e in meta["episodes"]] == [4_000_000, 4_000_001, 4_000_002] * 2
    assert all(1 <= e["length"] <= 6 for e in meta["episodes"])
    # deterministic, wherever the envs run: the same arguments roll out the same episodes (the
    # batch decides which episode gets which sampling noise, as in `vla eval`)
    collect(micro_policy, tmp_path / "again", 3, batch_episodes=4, progress=False, env_workers=2)
    a, b = LeRobotDataset(rollouts), LeRobotDataset(tmp_path / "again")
    for key in ("action", "observation.state", "observation.environment_state", "next.success"):
        np.testing.assert_array_equal(a.columns[key], b.columns[key])
    np.testing.assert_array_equal(
        a.image("observation.images.scene", 5), b.image("observation.images.scene", 5)
    )
    a.close(), b.close()

    out = tmp_path / "labelled"
    report = label(micro_policy, [demos, rollouts], out, positive_fraction=0.3, progress=False)
    ds = LeRobotDataset(out)
    src = [LeRobotDataset(demos), LeRobotDataset(rollouts)]
    assert ds.num_episodes == sum(s.num_episodes for s in src) and len(ds) == sum(len(s) for s in src)
    np.testing.assert_array_equal(ds.columns["action"], np.concatenate([s.columns["action"] for s in src]))
    pos = np.asarray(ds.columns[ADVANTAGE_KEY]).reshape(-1)
    assert 0 < pos.mean() < 0.5 and report["frames"] == len(ds)
    assert (out / "meta" / "recap_value.json").exists()
    # pi*0.6's corrections: a dataset positive throughout, the others ranked among themselves
    forced = label(micro_policy, [rollouts], tmp_path / "forced", positive_data=[demos], progress=False)
    both = LeRobotDataset(tmp_path / "forced")
    flags = np.asarray(both.columns[ADVANTAGE_KEY]).reshape(-1)
    n_demo = len(src[0])
    assert flags[:n_demo].all() and 0 < flags[n_demo:].mean() < 0.5
    assert [s["forced_positive"] for s in forced["sources"]] == [True, False]
    both.close()
    with pytest.raises(ValueError, match="has no"):  # a feature one part lacks is refused, not dropped
        merge_datasets([demos, rollouts], tmp_path / "bad", keep=["action", "task_id"], progress=False)
    assert not (tmp_path / "bad").exists()
    for s in src:
        s.close()

    # the trainer's samples carry each frame's indicator; without the column: refused
    cfg = load_yaml(micro_policy / "config.yaml")
    cfg = replace(cfg, model=replace(cfg.model, advantage_conditioning=True, max_text_len=45),
                  data=replace(cfg.data, num_workers=0))  # fmt: skip
    samples = VLADataset(cfg, out)
    tok = load_tokenizer("byte")
    for i in (int(np.argmax(pos)), int(np.argmin(pos))):
        s = samples[i]
        want = ADVANTAGE_TEXT[bool(pos[i])]
        assert _text(tok, s["tokens"].numpy(), s["token_mask"].numpy()).endswith(want)
    with pytest.raises(ValueError, match="vla recap label"):
        VLADataset(cfg, demos)

    # served: the policy asks for "positive"
    model = build_model(cfg.model)
    policy = Policy(model)
    obs = policy.check(
        {"images": {"scene": np.zeros((64, 64, 3), np.uint8)}, "state": np.zeros(5), "prompt": TASK}
    )
    batch = policy.model_batch([obs])
    assert _text(tok, batch["tokens"][0].numpy(), batch["token_mask"][0].numpy()).endswith(
        ADVANTAGE_TEXT[True]
    )
