"""utils/torchrun.py: the job's size and this process's place in it, read from torchrun's environment."""

import pytest

from lm_human_preference_details.utils.torchrun import processes_per_node, torchrun_rank, torchrun_world

VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


@pytest.fixture()
def environment(monkeypatch):
    """No torchrun variable set -> set(NAME=value, ...), which sets some for the test."""
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_variables(**values: str) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return set_variables


def test_without_torchrun_the_job_is_one_process_numbered_0(environment):
    assert torchrun_world() == (1, 0, 0)
    assert torchrun_rank() == "0" and processes_per_node() == 1


def test_each_variable_is_read_into_its_place(environment):
    # process 5 of 8, on the second of two nodes of 4 processes each: local index 1
    environment(WORLD_SIZE="8", RANK="5", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
    assert torchrun_world() == (8, 5, 1)
    assert torchrun_rank() == "5" and processes_per_node() == 4


def test_an_empty_variable_reads_as_unset_and_one_that_is_not_a_number_is_an_error(environment):
    environment(WORLD_SIZE="", RANK="", LOCAL_RANK="", LOCAL_WORLD_SIZE="")  # `RANK= python ...`
    assert torchrun_world() == (1, 0, 0) and torchrun_rank() == "0" and processes_per_node() == 1
    environment(WORLD_SIZE="2", RANK="one")  # never silently process 0: two processes would both speak for the job
    with pytest.raises(ValueError, match="'one'"):
        torchrun_world()
    with pytest.raises(ValueError, match="'one'"):
        torchrun_rank()
