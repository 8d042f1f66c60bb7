"""The tiny random Llama of the generation tests (heads 4 / 2; see tests/conftest.py)."""
import pytest


@pytest.fixture
def tiny_model(tiny_llama):
    return tiny_llama()
