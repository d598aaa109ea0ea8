"""The `llama3_model_dir` fixture: a model directory holding Llama 3's real tokenizer, built from Meta's
tokenizer.model (tinyvllm.model.llama3_tokenizer), so the tests need no download and no gated repo."""
from pathlib import Path

import pytest

from tests.references import missing_reference
from tinyvllm.model.llama3_tokenizer import meta_tokenizer_model_path, write_llama3_tokenizer_files


@pytest.fixture(scope="session")
def llama3_model_dir(tmp_path_factory) -> Path:
    """A model directory holding only the Llama 3 tokenizer. Built once per session."""
    if meta_tokenizer_model_path() is None:
        missing_reference("Meta's Llama 3 tokenizer.model (pip install --no-deps llama-models==0.3.0)")
    return write_llama3_tokenizer_files(tmp_path_factory.mktemp("llama3_tokenizer"))
