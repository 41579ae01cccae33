"""Copy finished base-model cells of some (m, d_model) pairs from OUT/rgr-budget into another experiment's folder
(identical configs, so identical cells; the file names the experiment it now belongs to).

    python share_cells.py OUT TARGET m:d,m:d [DEST]   # into DEST/TARGET/cells (default DEST: OUT)"""
import json, sys
from pathlib import Path
out, target, pairs = Path(sys.argv[1]), sys.argv[2], {tuple(int(x) for x in p.split(":")) for p in sys.argv[3].split(",")}
dest = (Path(sys.argv[4]) if len(sys.argv) > 4 else out) / target / "cells"
dest.mkdir(parents=True, exist_ok=True)
n = 0
for path in sorted((out / "rgr-budget" / "cells").glob("*.json")):
    cell = json.loads(path.read_text())
    c = cell["config"]
    if (c["m"], c["d_model"]) in pairs and "degree" not in c and "aggregation" not in c and not (dest / path.name).exists():
        cell["experiment"] = target
        (dest / path.name).write_text(json.dumps(cell, indent=1))
        n += 1
print(f"shared {n} cells into {dest}")
