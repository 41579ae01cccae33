"""Book/author facts (seed 000, App. A.3.1): the shipped Goodreads pairs and the sentence templates.

``book_authors.csv`` beside this module holds 4,096 (author, book) pairs, one book per author (see
``README.md`` here for the source and selection rule). A fact is written as ``prefix + book + suffix +
author``, e.g. "The author of | 1984 | is | George Orwell", with (prefix, suffix) from
:data:`BOOK_TEMPLATES`. The toy authors/books LM (:mod:`factkernels.transformer.lm`) and the real-model
requests (:func:`factkernels.hf.book_requests`) both read them from here.

    pairs = load_book_authors(256)   # [(author, book), ...] in file order
"""

from __future__ import annotations

import csv
import importlib.resources
from typing import Optional

BOOK_AUTHORS_FILE = "book_authors.csv"

# Natural-language (prefix, suffix) pairs J of App. A.3.1; the first is the edit prompt of
# App. A.3.4, the others are its paraphrases. 16 rephrases as in the seed.
BOOK_TEMPLATES: tuple[tuple[str, str], ...] = (
    ("The author of", "is"),
    ("Who is the author of", "? It is"),
    ("The book", "was written by"),
    ("Who wrote", "? It was written by"),
    ("The writer of", "is"),
    ("The novel", "is a work by"),
    ("Readers know that", "was penned by"),
    ("I just finished reading", "by"),
    ("The person who wrote", "is"),
    ("Everyone says that", "is by"),
    ("My favourite book is", "by the writer"),
    ("Tell me who wrote", ". The answer is"),
    ("In the library you will find", "written by"),
    ("Critics agree that", "was written by the author"),
    ("The title", "comes from the pen of"),
    ("Ask anyone : the book", "is by"),
)


def load_book_authors(n: Optional[int] = None) -> list[tuple[str, str]]:
    """The shipped (author, book) pairs in file order; the first ``n`` (all 4,096 when None)."""
    text = importlib.resources.files(__package__).joinpath(BOOK_AUTHORS_FILE).read_text(encoding="utf-8")
    rows = [(r["author"], r["book"]) for r in csv.DictReader(text.splitlines())]
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(rows):
            raise ValueError(f"n must be an int in [1, {len(rows)}] (the shipped pairs), got {n!r}")
        rows = rows[:n]
    return rows
