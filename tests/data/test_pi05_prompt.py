"""Pi0.5 (``model.variant=pi05``): training samples and served observations carry the same
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
    cfg = load_config("tiny", overrides=["model.camera_names=[scene,wrist]", "model.variant=pi05",
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
