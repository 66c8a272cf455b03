import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from vlastack.cli import main
from vlastack.infer.export import ExportedSampler, example_inputs, export_policy, write_raw_inputs
from vlastack.infer.policy import Policy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def policy(policy_dir):
    return Policy.from_pretrained(policy_dir)


def _check_sidecar(out: Path, fmt: str) -> dict:
    sc = json.loads((out / "policy.json").read_text())
    assert sc["format"] == fmt and (out / sc["artifact"]).exists()
    assert [i["name"] for i in sc["inputs"]] == [
        "images",
        "image_mask",
        "tokens",
        "token_mask",
        "state",
        "noise",
    ]
    assert sc["outputs"][0]["shape"] == [1, 16, 7] and sc["camera_names"] == ["scene", "wrist"]
    assert sc["normalization"]["modes"]["action"] == "quantiles" and sc["tokenizer"]["max_len"] == 24
    assert sc["action_representation"] == "unspecified"  # a fixture never trained on recorded data
    assert sc["check"]["passed"] and sc["check"]["max_abs_diff"] <= 1e-4
    return sc


def test_export_torchscript_via_cli(policy_dir, tmp_path, capsys):
    out = tmp_path / "ts"
    assert main(["export", "--policy", str(policy_dir), "--format", "torchscript", "--out", str(out)]) == 0
    assert "max |artifact - eager|" in capsys.readouterr().out
    _check_sidecar(out, "torchscript")


def test_export_matches_policy_infer(policy, tmp_path):
    """The artifact (normalization baked in) gives what Policy.infer gives for the same inputs."""
    export_policy(policy, "torchscript", tmp_path)
    obs = policy.check(
        {
            "images": {"scene": np.full((64, 64, 3), 7, np.uint8)},
            "state": np.ones(6, np.float32),
            "prompt": "go",
        }
    )
    noise = torch.randn(1, 16, 8)
    want = policy.infer_checked([obs], noise=noise)
    from vlastack.infer.obs import build_batch

    c = policy.cfg
    b = build_batch([obs], policy.spec, c.state_dim, c.max_text_len, policy.tokenizer, policy.normalizer)
    ts = torch.jit.load(str(tmp_path / "policy.ts"))
    with torch.no_grad():
        got = ts(b["images"], b["image_mask"], b["tokens"], b["token_mask"], torch.ones(1, 6), noise).numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.integration
def test_export_onnx(policy, tmp_path):
    export_policy(policy, "onnx", tmp_path)
    _check_sidecar(tmp_path, "onnx")


@pytest.mark.slow
def test_export_pt2(policy, tmp_path):
    export_policy(policy, "pt2", tmp_path)
    _check_sidecar(tmp_path, "pt2")


@pytest.mark.slow
def test_cpp_example_matches_python(policy, tmp_path):
    """Build examples/cpp against the wheel's libtorch; run the pt2 and TorchScript artifacts."""
    if not shutil.which("cmake") or not shutil.which("g++"):
        pytest.fail("cmake and g++ are needed for the C++ example")
    export_policy(policy, "pt2", tmp_path / "pt2")
    export_policy(policy, "torchscript", tmp_path / "ts")
    args = example_inputs(policy, 1, seed=7)
    write_raw_inputs(args, tmp_path / "in")
    with torch.no_grad():
        want = ExportedSampler(policy).eval()(*args).numpy()
    build = tmp_path / "build"
    subprocess.run(
        [
            "cmake",
            "-S",
            str(ROOT / "examples/cpp"),
            "-B",
            str(build),
            "-DCMAKE_BUILD_TYPE=Release",
            f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(["cmake", "--build", str(build), "-j2"], check=True, capture_output=True)
    for art in (tmp_path / "pt2/policy.pt2", tmp_path / "ts/policy.ts"):
        out = tmp_path / "actions.bin"
        r = subprocess.run(
            [str(build / "vla_infer"), str(art), str(tmp_path / "in/inputs.txt"), str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("actions [1, 16, 7]")
        got = np.fromfile(out, dtype=np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, atol=1e-4)


@pytest.mark.integration  # ~16 s on 2 AVX2 cores: two exporters over a token decoder
def test_token_head_exports(tmp_path):
    """A bins token head (OFT-style parallel decoding) exports and matches eager."""
    from vlastack.config import apply_overrides, tiny
    from vlastack.models import build_model

    over = ["model.vision.depth=1", "model.vlm.depth=1", "model.expert.depth=1", "model.head=tokens"]
    over += [
        "model.head_options.placement=new_rows",
        "model.head_options.decoding=parallel",
        "model.action_horizon=4",
    ]
    cfg = apply_overrides(tiny(), [*over, "eval.steps_per_chunk=4"]).model
    torch.manual_seed(0)
    model = build_model(cfg)
    model.head.fit_tokenizer(torch.rand(64, 4, 8) * 2 - 1)
    for fmt in ("torchscript", "onnx"):
        side = export_policy(Policy(model), fmt, tmp_path / fmt)
        assert side["check"]["passed"] and side["head"] == "tokens"


def test_fast_token_head_refuses_export(tmp_path):
    from vlastack.config import apply_overrides, tiny
    from vlastack.models import build_model

    fast = apply_overrides(tiny(), ["model.head=tokens", "model.head_options.tokenizer=fast"]).model
    with pytest.raises(ValueError, match="FAST"):
        export_policy(Policy(build_model(fast)), "onnx", tmp_path / "fast")
