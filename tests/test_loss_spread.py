"""`python -m benchmarks.loss_spread` on the CPU, tiny models: per seed losses against eager's,
the results written, and a model name it does not know refused."""
from __future__ import annotations

import json

import pytest

from benchmarks import loss_spread


def test_loss_spread_runs_and_writes_its_table(tmp_path):
    assert loss_spread.main(["--tiny", "--device", "cpu", "--models", "llama", "--seeds", "2",
                             "--steps", "2", "--contenders", "eager,eager_again,fusion_cache",
                             "--out", str(tmp_path)]) == 0  # fmt: skip
    (path,) = tmp_path.glob("loss-spread-*.json")
    rows = json.loads(path.read_text())["models"]["llama"]
    assert set(rows) == {"eager_again", "fusion_cache"}
    assert rows["eager_again"]["max_loss_diff"] == [0.0, 0.0]
    assert len(rows["fusion_cache"]["max_loss_diff"]) == 2
    assert rows["fusion_cache"]["loss_max"] < 1e-4  # the reference evaluator runs the regions here
    assert path.with_suffix(".md").read_text().startswith("# Loss deviation")


def test_an_unknown_model_is_refused(capsys):
    with pytest.raises(SystemExit):
        loss_spread.main(["--tiny", "--device", "cpu", "--models", "gpt3"])
    assert "unknown gpt3" in capsys.readouterr().err
