import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: on a loaded shared machine OpenMP spin-waits make tiny ops 100x slower."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
