"""Checkpoint files (aria/trainers/checkpoint.py): an exact round trip without pickle, and a
checkpoint from someone else that would run code when unpickled."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from aria.trainers.checkpoint import load_state, rng_state, save_state, set_rng_state
from aria.trainers.offline import OfflineTrainer
from test_offline_trainer import config, samples


def test_state_round_trip_is_exact(tmp_path):
    state = {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 2)}, 7: {"m": torch.ones(2, dtype=torch.bfloat16)}},
             "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 7], "foreach": None, "name": "x"}],
             "numpy": ("MT19937", np.arange(5, dtype=np.uint32), 3, 0, 0.0), "empty": torch.zeros(0), "flag": True}
    save_state(tmp_path / "s.safetensors", state)
    back = load_state(tmp_path / "s.safetensors")
    assert set(back["state"]) == {0, 7}  # integer keys stay integers
    assert torch.equal(back["state"][0]["exp_avg"], state["state"][0]["exp_avg"])
    assert back["state"][7]["m"].dtype == torch.bfloat16
    assert back["param_groups"][0]["betas"] == (0.9, 0.999)  # tuples stay tuples
    assert back["numpy"][0] == "MT19937" and back["numpy"][1].dtype == np.uint32 and back["numpy"][1].tolist() == [0, 1, 2, 3, 4]
    assert back["flag"] is True and back["empty"].numel() == 0
    with pytest.raises(TypeError, match="cannot store a function"):
        save_state(tmp_path / "bad.safetensors", {"f": lambda: None})


def test_rng_state_round_trip(tmp_path):
    save_state(tmp_path / "rng.safetensors", rng_state())
    expected = (np.random.rand(), torch.rand(3))
    set_rng_state(load_state(tmp_path / "rng.safetensors"))
    assert (np.random.rand(), torch.rand(3).tolist()) == (expected[0], expected[1].tolist())


class Payload:
    """Unpickling this opens (creates) a file: what a hostile checkpoint could do instead."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_hostile_checkpoint_runs_no_code(tmp_path, tiny_model_dir):
    cfg = config(tmp_path, tiny_model_dir, samples(4), "train.micro_batch_size=4", "train.gradient_accumulation_steps=1",
                 "train.epochs=1", "train.save_freq=1")
    OfflineTrainer(cfg).train()
    [checkpoint] = (tmp_path / "out" / "checkpoints").glob("step-*")
    marker = tmp_path / "code-ran"
    # The old format's names, as a checkpoint written by (or disguised as) an older version.
    torch.save({"state": Payload(marker)}, checkpoint / "optimizer.pt")
    torch.save(Payload(marker), checkpoint / "rng_state_0.pt")
    with pytest.raises(ValueError, match=r"pickle files \(.pt\) of an older version.*use a new output_dir"):
        OfflineTrainer(cfg).train()
    assert not marker.exists()
    # A pickle renamed to the new name is not read as a pickle either.
    for name in ("optimizer.pt", "rng_state_0.pt"):
        (checkpoint / name).unlink()
    torch.save({"state": Payload(marker)}, checkpoint / "optimizer.safetensors")
    with pytest.raises(ValueError, match=r"every checkpoint in .* is damaged .*delete .* to start over"):
        OfflineTrainer(cfg).train()
    assert not marker.exists()
    assert json.loads((checkpoint / "trainer_state.json").read_text())["step"] == 1
