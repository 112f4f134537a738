"""The unit tier runs its tiny random models on one thread: at these sizes a second thread costs
more in hand-offs than it computes (the tier took 102 s on two threads, 71 s on one)."""
import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
