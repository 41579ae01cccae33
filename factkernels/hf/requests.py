"""Edit requests: MEMIT/CounterFact-style facts, their validation, and the shipped book/author set.

    {"prompt": "{} was written by", "subject": "The Hobbit", "target_new": " Jane Austen"}

``prompt`` holds one ``{}`` where the subject goes (or contains the subject literally);
``target_new`` may be several tokens. CounterFact records
(``{"requested_rewrite": {..., "target_new": {"str": ...}}}``) are accepted as they are.
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from ..datasets import BOOK_TEMPLATES, load_book_authors


@dataclass(frozen=True)
class Request:
    """One fact to insert: ``prompt.format(subject)`` should continue with ``target_new``.

    prompt: text with exactly one ``{}`` (the subject's place); subject: non-empty;
    target_new: non-empty, starts with a space unless the prompt ends with whitespace
    (added as ROME/MEMIT do); target_true: the model's current answer, if known.
    """

    prompt: str
    subject: str
    target_new: str
    target_true: Optional[str] = None

    @property
    def text(self) -> str:
        """The prompt with the subject filled in."""
        return self.prompt.replace("{}", self.subject, 1)

    @property
    def subject_span(self) -> tuple[int, int]:
        """Character span [start, end) of the subject in :attr:`text`."""
        start = self.prompt.index("{}")
        return start, start + len(self.subject)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _text_field(record: Mapping, key: str) -> Any:
    value = record.get(key)
    if isinstance(value, Mapping):  # CounterFact: {"str": ..., "id": ...}
        value = value.get("str")
    return value


def make_request(record: Union[Request, Mapping], index: int = 0) -> Request:
    """Validate one request dict (or CounterFact record) and return a :class:`Request`."""
    if isinstance(record, Request):
        record = asdict(record)
    if not isinstance(record, Mapping):
        raise TypeError(f"request {index} must be a dict with prompt, subject and target_new, got {type(record).__name__}")
    if isinstance(record.get("requested_rewrite"), Mapping):
        record = record["requested_rewrite"]
    prompt, subject = _text_field(record, "prompt"), _text_field(record, "subject")
    target_new, target_true = _text_field(record, "target_new"), _text_field(record, "target_true")
    for key, value in (("prompt", prompt), ("subject", subject), ("target_new", target_new)):
        if not isinstance(value, str):
            raise ValueError(f"request {index}: {key} must be a string, got {value!r}")
    if not subject.strip():
        raise ValueError(f"request {index}: subject is empty")
    if not target_new.strip():
        raise ValueError(f"request {index}: target_new is empty; give the text the model should produce")
    if prompt.count("{}") > 1:
        raise ValueError(f"request {index}: prompt {prompt!r} has more than one '{{}}' placeholder for the subject")
    if "{}" not in prompt:
        if subject not in prompt:
            raise ValueError(f"request {index}: subject {subject!r} is not in the prompt {prompt!r}; write the prompt "
                             "with '{}' where the subject goes, or include the subject literally")
        prompt = prompt.replace(subject, "{}", 1)
    if not prompt.replace("{}", "").strip():
        raise ValueError(f"request {index}: prompt {prompt!r} has no words besides the subject")
    if prompt.endswith("{}"):
        raise ValueError(f"request {index}: prompt {prompt!r} ends with the subject; the target must follow words "
                         "after it (e.g. '{} was written by')")
    if not prompt[-1].isspace() and not target_new[0].isspace():
        target_new = " " + target_new
    if target_true is not None and not isinstance(target_true, str):
        raise ValueError(f"request {index}: target_true must be a string when given, got {target_true!r}")
    if target_true is not None and not prompt[-1].isspace() and not target_true[:1].isspace():
        target_true = " " + target_true
    return Request(prompt=prompt, subject=subject, target_new=target_new, target_true=target_true)


def parse_requests(requests: Union[str, Path, Sequence[Union[Request, Mapping]]]) -> list[Request]:
    """Requests from a list of dicts/Requests, or a .json (list, or {"requests": [...]}) or .csv file
    (columns prompt, subject, target_new[, target_true]). Raises ValueError naming the bad request, and
    the file it came from."""
    if not isinstance(requests, (str, Path)):
        return _parse_records(requests)
    path = Path(requests)
    try:
        return _parse_records(_read_request_file(path))
    except (ValueError, TypeError) as err:
        raise type(err)(f"requests file {path}: {err}") from None


def _read_request_file(path: Path) -> Any:
    """The records of a .json or .csv requests file (not yet checked)."""
    if not path.is_file():
        raise FileNotFoundError(f"requests file {path} does not exist")
    if path.suffix.lower() == ".csv":
        with path.open(newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    if path.suffix.lower() != ".json":
        raise ValueError("must be .json or .csv")
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})") from None
    return records.get("requests") if isinstance(records, Mapping) else records


def _parse_records(records: Any) -> list[Request]:
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Sequence):
        raise TypeError(f"requests must be a list of request dicts or a .json/.csv path, got {type(records).__name__}")
    if len(records) == 0:
        raise ValueError("requests is empty")
    parsed = [make_request(r, i) for i, r in enumerate(records)]
    seen: dict[tuple[str, str], int] = {}
    for i, r in enumerate(parsed):
        first = seen.setdefault((r.prompt, r.subject), i)
        if first != i and parsed[first].target_new != r.target_new:
            raise ValueError(f"requests {first} and {i} ask for different targets on the same prompt and subject")
    return parsed


def template_prompt(prefix: str, suffix: str) -> str:
    """One of the book templates as a request prompt: 'The author of {} is'."""
    gap = "" if suffix[:1] in "?.,!:;" else " "
    return f"{prefix} {{}}{gap}{suffix}"


BOOK_PROMPTS: tuple[str, ...] = tuple(template_prompt(p, s) for p, s in BOOK_TEMPLATES)


@dataclass
class RequestSet:
    """Requests with what evaluation needs: paraphrases (same facts, other templates) and
    neighborhood prompts (other subjects, whose top-1 prediction must not change)."""

    requests: list[Request]
    paraphrases: list[Request] = field(default_factory=list)
    neighborhood: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"requests": [r.to_dict() for r in self.requests],
                "paraphrases": [r.to_dict() for r in self.paraphrases], "neighborhood": list(self.neighborhood)}


def book_requests(n: int, seed: int = 0, *, paraphrases_per_fact: int = 2, template: int = 0) -> RequestSet:
    """Counterfactual author facts from the shipped book/author pairs.

    n books are drawn (seeded); each gets another book's author as ``target_new`` (never its
    own). Insertion uses ``BOOK_PROMPTS[template]``; ``paraphrases_per_fact`` other templates
    (of the 16) give the paraphrases; the neighborhood is n other books (as many as remain)
    in the insertion template.
    """
    pairs = load_book_authors()
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(pairs) - 1:
        raise ValueError(f"n must be an int in [1, {len(pairs) - 1}], got {n!r}")
    if not 0 <= paraphrases_per_fact <= len(BOOK_PROMPTS) - 1:
        raise ValueError(f"paraphrases_per_fact must be in [0, {len(BOOK_PROMPTS) - 1}], got {paraphrases_per_fact}")
    if not 0 <= template < len(BOOK_PROMPTS):
        raise ValueError(f"template must be in [0, {len(BOOK_PROMPTS)}), got {template}")
    rng = random.Random(seed)
    order = rng.sample(range(len(pairs)), len(pairs))
    chosen, others = order[:n], order[n:]
    authors = sorted({a for a, _ in pairs})
    other_templates = [t for t in range(len(BOOK_PROMPTS)) if t != template]
    requests, paraphrases = [], []
    for i in chosen:
        author, book = pairs[i]
        new_author = rng.choice(authors)
        while new_author == author:
            new_author = rng.choice(authors)
        requests.append(Request(BOOK_PROMPTS[template], book, " " + new_author, " " + author))
        for t in rng.sample(other_templates, paraphrases_per_fact):
            paraphrases.append(Request(BOOK_PROMPTS[t], book, " " + new_author, " " + author))
    neighborhood = [BOOK_PROMPTS[template].replace("{}", pairs[i][1], 1) for i in others[:n]]
    return RequestSet(requests, paraphrases, neighborhood)
