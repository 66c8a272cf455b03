"""Pi0.5 (``model.head_options.variant=pi05``): training samples and served observations carry the same
state-in-prompt tokens, built from the normalized, unpadded state."""

from __future__ import annotations

import numpy as np
import torch

from vlastack.config import load_config
from vlastack.data.samples import make_dataset
from vlastack.infer.obs import InputSpec, Obs, build_batch
from vlastack.models.prompt import pi05_prompt
from vlastack.models.tokenizer import load_tokenizer


def test_samples_and_policy_batches_write_the_state_into_the_prompt(dataset):
    root, data = dataset
    cfg = load_config("tiny", overrides=["model.camera_names=[scene,wrist]", "model.head_options.variant=pi05",
                                         "model.max_text_len=96"])  # fmt: skip
    ds = make_dataset(cfg, root)
    tok = load_tokenizer("byte")
    s = ds[12 + 3]  # episode 1 ("task 1"), frame 3
    state = s["state"][:5].numpy()
    assert tok.decode(s["tokens"][s["token_mask"]].tolist()) == pi05_prompt("task 1", state)
    other = ds[12 + 4]
    assert not torch.equal(other["tokens"], s["tokens"])  # per frame, not per task
    # The policy's batch from the raw observation equals the training sample's tokens.
    spec = InputSpec.make(cfg.model.camera_names, 5, cfg.model.vision.image_size, "")
    obs = Obs(images={}, state=data[1]["observation.state"][3], prompt="task 1")
    b = build_batch([obs], spec, cfg.model.state_dim, 96, tok, ds.normalizer, state_in_prompt=True)
    assert torch.equal(b["tokens"][0], s["tokens"]) and torch.equal(b["token_mask"][0], s["token_mask"])
    np.testing.assert_allclose(b["state"][0, :5].numpy(), state, rtol=1e-6, atol=1e-6)


def test_a_prompt_that_would_lose_the_state_is_refused(dataset):
    """Issue #36 item 6: a Pi0.5 prompt cut short drops the state with no word. The tiny preset's
    Pi0.5 fits; too short a prompt is refused at config time (the shortest prompt), by the dataset
    (its longest task with 3-digit bins) and by the policy (the request's exact prompt)."""
    import pytest

    from vlastack.data.samples import VLADataset
    from vlastack.infer.obs import ObsError
    from vlastack.infer.policy import Policy
    from vlastack.models.vla import build_model

    root, data = dataset
    cams = "model.camera_names=[scene,wrist]"
    assert load_config("tiny", overrides=["model.head_options.variant=pi05"]).model.max_text_len == 88
    assert (
        load_config(
            "tiny", overrides=["model.head_options.variant=pi05", "model.max_text_len=60"]
        ).model.max_text_len
        == 60
    )
    with pytest.raises(
        ValueError, match=r"model\.max_text_len: 24 tokens cannot hold a Pi0\.5 prompt.*at least 42"
    ):
        load_config("tiny", overrides=["model.head_options.variant=pi05", "model.max_text_len=24"])
    # BOS + "Task: task 1, State: " + 5 x "255" + ";\nAction: " = 51 tokens at most.
    assert len(load_tokenizer("byte").encode(pi05_prompt("task 1", np.ones(5)))) == 51
    with pytest.raises(ValueError, match="needs up to 51 tokens"):
        VLADataset(
            load_config("tiny", overrides=[cams, "model.head_options.variant=pi05", "model.max_text_len=50"]),
            root,
        )
    cfg = load_config("tiny", overrides=[cams, "model.head_options.variant=pi05", "model.max_text_len=51"])
    ds = VLADataset(cfg, root)
    policy = Policy(build_model(cfg.model), ds.normalizer, seed=0)
    img = np.zeros((64, 64, 3), np.uint8)
    obs = {"images": {"scene": img}, "state": data[1]["observation.state"][3], "prompt": "task 1"}
    policy.check(obs)
    with pytest.raises(ObsError, match=r"needs \d+ tokens and the policy holds 51"):
        policy.check(obs | {"prompt": "task 1 but with a much longer instruction"})
