"""Fixtures for the evaluation tests: SmolLM2 on CPU (float32), skipped when not installed."""
import pytest


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct."""
    pytest.importorskip("gguf")
    from kvlab.model import load_model
    try:
        return load_model("smollm2")
    except (FileNotFoundError, ValueError) as e:
        pytest.skip(f"SmolLM2 not installed: {e}")
