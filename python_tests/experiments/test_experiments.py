"""Every registered experiment runs at scale "tiny" through the engine and yields cells, summary and claims."""

import json

import pytest

from factkernels.experiments import REGISTRY, engine


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_experiment_runs_tiny(name, tiny_run):
    result, folder = tiny_run(name)
    assert result.missing == 0 and result.ran == result.total > 0
    assert len(list((folder / "cells").glob("*.json"))) == result.total
    saved = json.loads((folder / "summary.json").read_text())
    declared = {c.id for c in REGISTRY[name].claims}
    # every declared claim gets a finding; experiments beyond the papers (real-lm-editing) declare none
    assert set(saved["summary"]["claims"]) == declared and len(saved["summary"]) > 1
    for finding in saved["summary"]["claims"].values():
        assert finding["verdict"] in engine.VERDICTS and finding["setting"]
    for path in saved["figures"]:
        assert path.endswith(".png") and (folder / path.split("/")[-1]).stat().st_size > 5000


def test_claim_ids_are_unique_and_name_their_paper():
    ids = [c.id for e in REGISTRY.values() for c in e.claims]
    assert len(ids) == len(set(ids))
    for e in REGISTRY.values():
        for c in e.claims:
            assert c.paper in ("000", "002") and c.id.startswith(c.paper + "-") and c.value


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_grids_grow_with_scale_and_have_distinct_cells(name):
    counts = []
    for scale in engine.SCALES:
        grid = REGISTRY[name].grid(scale)
        keys = [engine.cell_key(c) for c in grid]
        assert grid and len(set(keys)) == len(keys)
        json.dumps(grid)  # configs are plain JSON
        counts.append(len(grid))
    assert counts == sorted(counts)  # tiny <= quick <= seed cells
