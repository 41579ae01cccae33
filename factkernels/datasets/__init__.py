"""Data shipped with factkernels and its readers: one home that ``hf/``, the toy LM and the experiments read.

    from factkernels import datasets
    datasets.load_book_authors(256)        # [(author, book), ...]: the Goodreads facts of seed 000 App. A.3.1
    datasets.BOOK_TEMPLATES                # the 16 (prefix, suffix) sentence templates of those facts
    datasets.natural_text("eval")          # list[str]: held-out prose written by SmolLM2-135M-Instruct
    datasets.wikipedia_leads()             # list[str]: 10,033 English Wikipedia article leads (~1.05M tokens)
    E, tokens = datasets.token_embeddings(1024)   # (1024, 384) all-MiniLM-L6-v2 whole-word token embeddings

Modules are named after the file each reads; the files sit beside them (``README.md`` here gives each
file's source, licence and selection rule). Nothing is downloaded at run time.
"""

from .book_authors import BOOK_TEMPLATES, load_book_authors
from .minilm_tokens import SHIPPED_TOKENS, token_embeddings
from .smollm2_text import TEXT_SPLITS, natural_text
from .wikipedia_leads import wikipedia_leads

__all__ = ["BOOK_TEMPLATES", "load_book_authors", "SHIPPED_TOKENS", "token_embeddings", "TEXT_SPLITS", "natural_text",
           "wikipedia_leads"]
