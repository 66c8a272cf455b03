"""Issue #65: ``Policy.from_pretrained`` walks through each loading module once. A module on the
loading path (the policy shell, the readers, the format conversion, the model class) that is
called again after the load has left it entirely (none of its frames on the stack), from another
module than the one that called it first, is a return trip: the kind of path that took 34 stops
in 11 files before the readers were split. A format's reader calling its conversion helpers one
after another is the intended shape (the reader is the hub) and is not counted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.infer.conftest import micro_config
from vlastack.infer.policy import Policy
from vlastack.models import build_model

# The modules that steer a load; leaf libraries (fileio, safetensors_io, config) are used from
# anywhere and are not stops.
LOADING = (
    "vlastack.infer.policy",
    "vlastack.infer.readers",
    "vlastack.models.convert.locate",
    "vlastack.models.convert.lerobot",
    "vlastack.models.convert.pi0_fast",
    "vlastack.models.vla",
)


def _module(frame) -> str:
    return frame.f_globals.get("__name__", "")


def load_path(folder) -> tuple[list[str], list[str]]:
    """-> (the loading modules in the order first entered, those entered again after leaving)."""
    order: list[str] = []
    again: list[str] = []
    first_caller: dict[str, str] = {}

    def prof(frame, event, arg):
        if event != "call":
            return
        mod = _module(frame)
        # ``Checkpoint`` is the located folder as data: its lazy fields (the safetensors header)
        # are read where they are needed, which is not a trip back to ``locate``.
        if not mod.startswith(LOADING) or frame.f_code.co_qualname.startswith("Checkpoint."):
            return
        caller, on_stack = frame.f_back, False
        while caller is not None:
            on_stack |= _module(caller) == mod
            caller = caller.f_back
        by, f = "", frame.f_back  # the nearest vlastack caller (a context manager's is contextlib)
        while f is not None and not (by := _module(f)).startswith("vlastack"):
            f = f.f_back
        if mod not in order:
            order.append(mod)
            first_caller[mod] = by
        elif not on_stack and by != first_caller[mod]:
            again.append(f"{mod} (from {by}; first from {first_caller[mod]})")

    sys.setprofile(prof)
    try:
        Policy.from_pretrained(folder)
    finally:
        sys.setprofile(None)
    return order, again


def test_from_pretrained_enters_each_loading_module_once(tmp_path, policy_dir):
    Policy.from_pretrained(policy_dir)  # imports done: only the calls of a load are counted
    order, again = load_path(policy_dir)
    assert not again, f"loading returned to {again} after leaving them (path: {order})"
    assert order[:2] == ["vlastack.infer.policy", "vlastack.infer.readers"]
    assert "vlastack.infer.readers.vlastack_folder" in order
    assert "vlastack.infer.readers.lerobot_openpi" not in order  # a vlastack folder never goes there
    build_model(micro_config()).save_pretrained(tmp_path)  # no norm stats: the same path
    assert not load_path(tmp_path)[1]


@pytest.mark.filterwarnings("ignore:.*shapes that are not the standard ones")
@pytest.mark.parametrize("kind", ["pi0", "pi05", "pi0_fast"])
def test_lerobot_checkpoint_load_has_no_return_trips(kind):
    folder = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / kind
    order, again = load_path(folder)
    assert not again, f"loading returned to {again} (path: {order})"
    assert "vlastack.infer.readers.lerobot_openpi" in order
    assert "vlastack.infer.readers.vlastack_folder" not in order
