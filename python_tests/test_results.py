import json
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch

from factkernels.results import save_figure, write_json


def test_write_json_is_strict_json_with_environment(tmp_path):
    path = write_json(tmp_path / "sub", "exp", {"x": torch.tensor([1.0, 2.0]), "nan": math.nan, "n": np.int64(3),
                                                 "pair": (1, 2)})
    data = json.loads(path.read_text())
    assert data["x"] == [1.0, 2.0] and data["nan"] is None and data["n"] == 3 and data["pair"] == [1, 2]
    assert "torch" in data["environment"] and "build" in data["environment"]


def test_save_figure_writes_png(tmp_path):
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    path = save_figure(fig, tmp_path, "line")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
