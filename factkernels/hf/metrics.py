"""The editing benchmark's metrics: CounterFact's scores beside exact match, fluency, consistency, KL, perplexity.

    base = record_baseline(model, tok, cases, texts=natural_text("eval"))   # before editing: the unedited values
    ... edit the model with the cases' requests (case_requests(cases)) ...
    scores = score_cases(model, tok, cases, base)      # {"efficacy_score": ..., "unedited": {...}, "by_relation": ...}
    summary = over_draws([scores_draw0, scores_draw1, scores_draw2])  # mean and 95 % t-interval per metric

Per edit case (a :class:`factkernels.datasets.editing_benchmark.EditCase`), as CounterFact (ROME, Meng et al.
2022) scores it, with p(target) = exp(mean token log-probability of the target after the prompt):

* efficacy_score: fraction of the case's edit prompts where p(new) > p(true); efficacy_magnitude: mean of
  p(new) − p(true); efficacy_exact: fraction where greedy decoding gives the whole new target;
* paraphrase_*: the same under the held-out templates (never used for editing);
* neighbourhood_score: fraction of other subjects' prompts where p(their true object) > p(new);
  neighbourhood_magnitude: mean p(true) − p(new); neighbourhood_exact: greedy still gives their true object;
* *_true_exact: greedy still gives the case's old object (before editing, under the held-out templates this
  is the unedited model's cross-template consistency: the ceiling of the paraphrase scores);
* fluency: ROME's generation entropy, the mean over greedy generations of the weighted (2/3, 4/3) mean of their
  bi- and tri-gram entropies (bits; words from a regex, not NLTK's tokenizer);
* consistency: ROME's reference score, approximated: TF-IDF cosine between the generation about the edited
  subject and reference text about the new object, which here is the unedited model's generations about known
  subjects whose true object under the same relation is the new object (ROME used Wikipedia text); the IDF is
  fitted before editing on the shipped natural text plus those references. Cases without such a subject are
  left out (``consistency_cases`` counts the rest);
* text: perplexity, its ratio to the unedited model's, and mean token KL(unedited ‖ edited) on held-out text.
  KL is also split by whether a text names an edited subject (locality is the part that names none).

Each case's score is the mean over its prompts; a draw's score the mean over its cases. Every metric is
reported beside the unedited model's value (``scores["unedited"]``), and broken down by relation and template.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Optional, Sequence

import torch

from ..datasets.editing_benchmark import EditCase, Fact, known_facts
from .capture import encode_requests, final_hidden, length_sorted_chunks, logits_at, model_device, pad_id
from ..datasets import natural_text
from .evaluate import Reference, record_reference, text_scores
from .requests import Request

KINDS = ("efficacy", "paraphrase", "neighbourhood")
SCORES = tuple(f"{k}_{s}" for k in KINDS for s in ("score", "magnitude", "exact", "true_exact"))


def case_requests(cases: Sequence[EditCase]) -> list[Request]:
    """The edit requests of ``cases``: every edit template of each case with its new target."""
    return [Request(t, c.subject, " " + c.target_new, " " + c.target_true) for c in cases for t in c.edit_prompts]


@dataclass
class _Rows:
    """Teacher-forced (prompt, subject, target) rows with what each row is: case (n,), kind index into KINDS,
    template index, whether the target is the case's new one."""

    requests: list = field(default_factory=list)
    case: list = field(default_factory=list)
    kind: list = field(default_factory=list)
    template: list = field(default_factory=list)
    is_new: list = field(default_factory=list)

    def add(self, case: int, kind: int, template: int, prompt: str, subject: str, new: str, true: str) -> None:
        for target, is_new in ((new, True), (true, False)):
            self.requests.append(Request(prompt, subject, " " + target))
            self.case.append(case), self.kind.append(kind), self.template.append(template), self.is_new.append(is_new)


def _rows(cases: Sequence[EditCase]) -> _Rows:
    rows = _Rows()
    for i, c in enumerate(cases):
        for t, prompt in enumerate(c.edit_prompts):
            rows.add(i, 0, t, prompt, c.subject, c.target_new, c.target_true)
        for t, prompt in enumerate(c.paraphrase_prompts):
            rows.add(i, 1, t, prompt, c.subject, c.target_new, c.target_true)
        for t, n in enumerate(c.neighbours):
            rows.add(i, 2, t, n.prompt, n.subject, c.target_new, n.target)
    return rows


@torch.no_grad()
def target_scores(model: Any, tok: Any, requests: Sequence[Request], *,
                  batch_size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced, per request: (mean token log-probability of ``target_new`` after the prompt (n,) float,
    whether greedy decoding produces the whole target (n,) bool)."""
    batch = encode_requests(tok, requests, with_target=True)
    mean_lp, exact = torch.empty(len(batch)), torch.empty(len(batch), dtype=torch.bool)
    for chunk in length_sorted_chunks(batch.attention_mask.sum(1), batch_size):
        sub = batch.rows(chunk)
        rows, positions, tokens = sub.target_positions()
        logp = logits_at(model, final_hidden(model, sub.input_ids, sub.attention_mask), rows, positions).log_softmax(-1)
        tokens = tokens.to(logp.device)
        own = logp.gather(1, tokens[:, None]).squeeze(1).cpu()
        hit = (logp.argmax(1) == tokens).cpu()
        count = sub.target_len.double()
        mean_lp[chunk] = (torch.zeros(len(sub), dtype=torch.double).index_add(0, rows, own.double()) / count).float()
        exact[chunk] = torch.ones(len(sub), dtype=torch.bool).scatter_reduce(0, rows, hit, "amin")
    return mean_lp, exact


@torch.no_grad()
def greedy_generations(model: Any, tok: Any, prompts: Sequence[str], *, max_new_tokens: int = 40,
                       batch_size: int = 32) -> list[str]:
    """Prompt plus greedy continuation of each prompt (left-padded batches), as text."""
    device, out = model_device(model), [""] * len(prompts)
    rows = [tok(p)["input_ids"] for p in prompts]
    for chunk in length_sorted_chunks(torch.tensor([len(r) for r in rows]), batch_size):
        width = max(len(rows[i]) for i in chunk.tolist())
        ids = torch.full((len(chunk), width), pad_id(tok), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, i in enumerate(chunk.tolist()):
            ids[j, width - len(rows[i]):], mask[j, width - len(rows[i]):] = torch.tensor(rows[i]), 1
        gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad_id(tok))
        for j, i in enumerate(chunk.tolist()):
            out[i] = prompts[i] + tok.decode(gen[j, width:], skip_special_tokens=True)
    return out


def _words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())


def ngram_entropy(text: str, ns: tuple[int, ...] = (2, 3), weights: tuple[float, ...] = (2 / 3, 4 / 3)) -> float:
    """ROME's fluency of one text: the mean over n of weight_n × the entropy (bits) of its n-gram frequencies."""
    words, parts = _words(text), []
    for n, w in zip(ns, weights):
        counts = Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
        total = sum(counts.values())
        parts.append(w * (-sum(c / total * math.log2(c / total) for c in counts.values()) if total else 0.0))
    return sum(parts) / len(parts)


class TfIdf:
    """TF-IDF vectors as scikit-learn's TfidfVectorizer makes them by default (lower case, words of 2+ word
    characters, smooth IDF ln((1 + N) / (1 + df)) + 1, raw counts, L2 norm), over the vocabulary of ``documents``."""

    def __init__(self, documents: Sequence[str]) -> None:
        df = Counter(w for d in documents for w in set(self.words(d)))
        self.idf = {w: math.log((1 + len(documents)) / (1 + c)) + 1 for w, c in df.items()}

    @staticmethod
    def words(text: str) -> list[str]:
        return re.findall(r"\b\w\w+\b", text.lower())

    def vector(self, text: str) -> dict[str, float]:
        v = {w: c * self.idf[w] for w, c in Counter(self.words(text)).items() if w in self.idf}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

    def similarity(self, a: str, b: str) -> float:
        va, vb = self.vector(a), self.vector(b)
        return sum(x * vb.get(w, 0.0) for w, x in va.items())


def generation_prompts(case: EditCase) -> list[str]:
    """Where fluency and consistency generate from: the case's first two held-out templates, subject filled in."""
    return [p.replace("{}", case.subject, 1) for p in case.paraphrase_prompts[:2]]


@dataclass
class Baseline:
    """The unedited model on a set of cases: its scores (``scores``, as :func:`score_cases` returns them), the
    text reference (KL, perplexity), the reference texts per (relation, object) and the TF-IDF fitted on them."""

    scores: dict
    text: Optional[Reference]
    references: dict
    tfidf: TfIdf
    generate: int


def reference_texts(model: Any, tok: Any, cases: Sequence[EditCase], *, known: Optional[Sequence[Fact]] = None,
                    per_object: int = 3, max_new_tokens: int = 40, batch_size: int = 32) -> dict[tuple[str, str], str]:
    """{(relation, object): text} for each case's new object: the model's generations after the first generation
    prompt of up to ``per_object`` facts of ``known`` (default: the shipped known facts) with that relation and
    object, the object appended."""
    wanted = {(c.relation, c.target_new): c for c in cases}
    known = [k.fact for k in known_facts()] if known is None else known
    about: dict = {}
    for f in known:
        key = (f.relation, f.object)
        if key in wanted and len(about.setdefault(key, [])) < per_object:
            about[key].append(f.subject)
    prompts, owners = [], []
    for key, subjects in about.items():
        for s in subjects:
            prompts.append(generation_prompts(replace(wanted[key], subject=s))[0] + " " + key[1])
            owners.append(key)
    texts = greedy_generations(model, tok, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size) if prompts else []
    out: dict = {}
    for key, text in zip(owners, texts):
        out[key] = (out.get(key, "") + " " + text).strip()
    return out


@torch.no_grad()
def record_baseline(model: Any, tok: Any, cases: Sequence[EditCase], *, texts: Sequence[str] = (),
                    generate: int = 100, known: Optional[Sequence[Fact]] = None, max_new_tokens: int = 40,
                    batch_size: int = 32) -> Baseline:
    """Everything :func:`score_cases` compares against, from the unedited model (call before editing).

    generate: fluency and consistency use the first ``generate`` cases (two greedy generations each; 0 skips).
    known: the facts whose subjects give consistency's reference texts (:func:`reference_texts`).
    """
    text_ref = record_reference(model, tok, texts=texts) if texts else None
    references = reference_texts(model, tok, cases[:generate], known=known, max_new_tokens=max_new_tokens,
                                 batch_size=batch_size) if generate else {}
    tfidf = TfIdf(list(natural_text("stats")) + list(references.values()))
    base = Baseline({}, text_ref, references, tfidf, generate)
    base.scores = score_cases(model, tok, cases, base, texts=texts, max_new_tokens=max_new_tokens,
                              batch_size=batch_size, _unedited=True)
    return base


def _mean(values: torch.Tensor) -> float:
    return float(values.double().mean()) if values.numel() else float("nan")


def _case_means(values: torch.Tensor, case: torch.Tensor, n: int) -> torch.Tensor:
    """Per-case mean of row values (cases without rows get NaN)."""
    total = torch.zeros(n, dtype=torch.double).index_add(0, case, values.double())
    count = torch.zeros(n, dtype=torch.double).index_add(0, case, torch.ones_like(values, dtype=torch.double))
    return total / count


def _kind_scores(new_lp, true_lp, new_exact, true_exact, case, n: int, kind: str) -> dict:
    """The four scores of one kind from its rows (each (rows,), aligned), means over cases of per-case means."""
    sign = 1.0 if kind != "neighbourhood" else -1.0
    won = (sign * (new_lp - true_lp) > 0).double()
    gap = sign * (new_lp.exp() - true_lp.exp())
    exact = (new_exact if kind != "neighbourhood" else true_exact).double()
    per_case = {"score": _case_means(won, case, n), "magnitude": _case_means(gap, case, n),
                "exact": _case_means(exact, case, n), "true_exact": _case_means(true_exact.double(), case, n)}
    return {f"{kind}_{name}": _mean(v[~v.isnan()]) for name, v in per_case.items()}


def harmonic_mean(values: Sequence[float]) -> float:
    """The harmonic mean ROME reports of efficacy, paraphrase and neighbourhood scores (0 if any is 0)."""
    return 0.0 if min(values) <= 0 else len(values) / sum(1.0 / v for v in values)


@torch.no_grad()
def score_cases(model: Any, tok: Any, cases: Sequence[EditCase], baseline: Baseline, *, texts: Sequence[str] = (),
                max_new_tokens: int = 40, batch_size: int = 32, _unedited: bool = False) -> dict:
    """Every metric of the module docstring for ``model`` on ``cases``, with ``baseline.scores`` (the unedited
    model) under "unedited", and "by_relation" / "by_template" breakdowns of the prompt scores."""
    if not cases:
        raise ValueError("cases is empty")
    rows = _rows(cases)
    lp, exact = target_scores(model, tok, rows.requests, batch_size=batch_size)
    case, kind, template = (torch.tensor(x) for x in (rows.case, rows.kind, rows.template))
    is_new = torch.tensor(rows.is_new)
    n = len(cases)
    scores: dict = {"num_cases": n}

    def block(mask: torch.Tensor, kind_name: str) -> dict:
        new, true = mask & is_new, mask & ~is_new  # rows come in (new, true) pairs, so these align
        return _kind_scores(lp[new], lp[true], exact[new], exact[true], case[new], n, kind_name)

    for k, name in enumerate(KINDS):
        scores.update(block(kind == k, name))
    scores["score"] = harmonic_mean([scores[f"{k}_score"] for k in KINDS])
    scores["by_relation"] = {}
    for relation in sorted({c.relation for c in cases}):
        in_rel = torch.tensor([c.relation == relation for c in cases])[case]
        part = {"num_cases": sum(c.relation == relation for c in cases)}
        for k, name in enumerate(KINDS):
            part.update({key: v for key, v in block((kind == k) & in_rel, name).items()
                         if key.endswith(("_score", "_exact"))})
        scores["by_relation"][relation] = part
    scores["by_template"] = {}
    for k, name in enumerate(KINDS[:2]):
        per = []
        for t in range(int(template[kind == k].max()) + 1):
            got = block((kind == k) & (template == t), name)
            per.append({key: got[key] for key in (f"{name}_score", f"{name}_exact", f"{name}_true_exact")})
        scores["by_template"][name] = per
    if baseline.generate:
        scores.update(_generation_scores(model, tok, cases[:baseline.generate], baseline, max_new_tokens, batch_size))
    if texts:
        scores.update(text_scores(model, tok, texts, baseline.text, subjects=[c.subject for c in cases]))
    if not _unedited:
        scores["unedited"] = {k: v for k, v in baseline.scores.items() if k not in ("by_relation", "by_template")}
        scores["unedited"]["by_relation"] = {r: {k: v for k, v in part.items() if k.endswith("true_exact")}
                                             for r, part in baseline.scores["by_relation"].items()}
    return scores


def _generation_scores(model: Any, tok: Any, cases: Sequence[EditCase], baseline: Baseline, max_new_tokens: int,
                       batch_size: int) -> dict:
    prompts = [p for c in cases for p in generation_prompts(c)]
    texts = greedy_generations(model, tok, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size)
    fluency = sum(ngram_entropy(t) for t in texts) / len(texts)
    sims = []
    for i, c in enumerate(cases):
        ref = baseline.references.get((c.relation, c.target_new))
        if ref is not None:
            mine = " ".join(texts[2 * i:2 * i + 2])
            sims.append(baseline.tfidf.similarity(mine, ref))
    return {"fluency": fluency, "consistency": sum(sims) / len(sims) if sims else float("nan"),
            "consistency_cases": len(sims), "generations": len(texts)}


def t_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean and two-sided Student-t interval of ``values`` (e.g. one score per draw): {mean, low, high, n}."""
    from scipy import stats

    xs = [float(v) for v in values if not math.isnan(float(v))]
    if not xs:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "n": 0}
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return {"mean": mean, "low": float("nan"), "high": float("nan"), "n": len(xs)}
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    half = float(stats.t.ppf(0.5 + level / 2, len(xs) - 1)) * sd / math.sqrt(len(xs))
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": len(xs)}


def over_draws(draw_scores: Sequence[dict], level: float = 0.95) -> dict:
    """{metric: t_interval over draws} for every top-level metric that is a number in every draw (a metric a draw
    lacks or holds as None, such as KL on texts naming no edited subject when every text names one, is left
    out), and under "unedited" the same for the unedited values."""
    def numeric(ds: Sequence[dict]) -> list[str]:
        return [k for k, v in ds[0].items()
                if all(isinstance(d.get(k), (int, float)) and not isinstance(d.get(k), bool) for d in ds)]

    out = {k: t_interval([d[k] for d in draw_scores], level) for k in numeric(draw_scores)}
    if all("unedited" in d for d in draw_scores):
        unedited = [d["unedited"] for d in draw_scores]
        out["unedited"] = {k: t_interval([u[k] for u in unedited], level) for k in numeric(unedited)}
    return out
