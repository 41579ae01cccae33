"""Facts into real Hugging Face causal LMs (Llama-style SwiGLU MLPs), by construction.

    from factkernels import datasets, hf
    model, tok = hf.load("smollm2-135m")          # packaged GGUF, or a local HF folder
    requests = hf.parse_requests([{"prompt": "{} was written by", "subject": "The Hobbit",
                                   "target_new": " Jane Austen"}])
    keys = hf.capture_keys(model, tok, requests, layer=8)          # (n, d) MLP inputs at the subject
    facts = hf.book_requests(100, seed=0)                           # counterfactual authors + eval sets
    ref = hf.record_reference(model, tok, neighborhood=facts.neighborhood, texts=datasets.natural_text("eval"))
    ins = hf.insert_facts(model, tok, facts.requests)               # appended units in one LlamaMLP
    hf.evaluate(model, tok, facts.requests, paraphrases=facts.paraphrases, neighborhood=facts.neighborhood,
                texts=datasets.natural_text("eval"), reference=ref)   # efficacy, paraphrase, neighborhood, ppl, KL
    ins.remove()                                                    # bit-for-bit the original again
    trace = hf.causal_trace(model, tok, "The Hobbit was written by", "The Hobbit")  # (layers, tokens) effects

Needs the ``hf`` extra (transformers, gguf, accelerate); importing this package does not.
"""

from .capture import (PromptBatch, capture, capture_keys, encode_requests, encode_texts, record_inputs,
                      site_module)
from .causal_trace import TraceResult, causal_trace, traced_layer
from .editors import EditResult, edit
from .evaluate import Reference, evaluate, fact_margins, record_reference
from .insert import insert_facts
from .layout import mlp_layers, mlp_module
from .loading import PACKAGED_MODELS, load, packaged_gguf
from .requests import BOOK_PROMPTS, Request, RequestSet, book_requests, make_request, parse_requests
from .statistics import key_second_moments
from .units import Insertion, InsertionReport

__all__ = [
    "load", "packaged_gguf", "PACKAGED_MODELS",
    "mlp_layers", "mlp_module",
    "Request", "RequestSet", "make_request", "parse_requests", "book_requests", "BOOK_PROMPTS",
    "edit", "EditResult", "key_second_moments", "causal_trace", "traced_layer", "TraceResult",
    "insert_facts", "Insertion", "InsertionReport", "evaluate", "record_reference", "Reference", "fact_margins",
    "PromptBatch", "encode_requests", "encode_texts", "capture", "capture_keys", "record_inputs", "site_module",
]
