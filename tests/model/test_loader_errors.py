"""Loaders against bad files: every problem is a ValueError (FileNotFoundError for a missing
path) that names the file and what is wrong, and a failed load never poisons the disk cache."""
from __future__ import annotations

import json
import shutil
import struct

import gguf
import pytest
import torch
from safetensors.torch import load_file, save_file

from _model_testlib import needs_smollm2, tiny_llama, write_tiny_gguf, write_tiny_hf_dir

pytestmark = pytest.mark.filterwarnings("ignore:no tokenizer")
K1 = "model.layers.1.self_attn.k_proj.weight"


def _expect(exc, call, *parts: str) -> None:
    """`call()` raises `exc` whose message contains every one of `parts`."""
    with pytest.raises(exc) as info:
        call()
    for part in parts:
        assert part in str(info.value), f"{part!r} not in {str(info.value)!r}"


@pytest.fixture(scope="module")
def model():
    return tiny_llama()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh disk cache for each test."""
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _cached_files(cache) -> list:
    return sorted(cache.rglob("*.*")) if cache.exists() else []


@pytest.fixture(scope="module")
def good_gguf(model, tmp_path_factory):
    """(bytes of a valid tiny F32 GGUF, byte offsets: first KV type, tensor info, last tensor's
    data offset field, tensor data)."""
    path = tmp_path_factory.mktemp("gguf") / "good.gguf"
    write_tiny_gguf(path, model)
    r = gguf.GGUFReader(str(path))
    first_kv = next(f for name, f in r.fields.items() if not name.startswith("GGUF."))
    last = r.tensors[-1].field
    offsets = {"kv_type": first_kv.offset + 8 + len(first_kv.name),
               "tensor_info": r.tensors[0].field.offset,
               "last_offset": last.offset + sum(int(p.nbytes) for p in last.parts) - 8,
               "data": r.data_offset}
    return path.read_bytes(), offsets


# ---- GGUF -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cut,problem", [
    pytest.param(lambda o: 12, "the header needs bytes 8..24", id="in-header"),
    pytest.param(lambda o: 60, "the metadata (key/value pairs) needs bytes", id="in-metadata"),
    pytest.param(lambda o: o["tensor_info"] + 10, "the tensor info needs bytes", id="in-tensor-info"),
    pytest.param(lambda o: o["data"], "the data of tensor token_embd.weight needs bytes",
                 id="at-tensor-data"),
    pytest.param(lambda o: o["data"] + 1000, "the data of tensor token_embd.weight needs bytes",
                 id="in-tensor-data"),
    pytest.param(lambda o: -1, "the data of tensor output.weight needs bytes", id="last-byte-missing"),
])
def test_truncated_gguf(good_gguf, tmp_path, cache, cut, problem):
    from kvlab.model import load_model

    data, offsets = good_gguf
    f = tmp_path / "cut.gguf"
    f.write_bytes(data[:cut(offsets)])
    _expect(ValueError, lambda: load_model(f, cache=False), str(f), "truncated or corrupt", problem)
    assert _cached_files(cache) == []


def _patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


@pytest.mark.parametrize("edit,problem", [
    pytest.param(lambda d, o: _patch(d, 0, b"GGML"), "is not a GGUF file", id="bad-magic"),
    pytest.param(lambda d, o: _patch(d, 4, struct.pack("<I", 99)), "version 99", id="bad-version"),
    pytest.param(lambda d, o: _patch(d, o["kv_type"], struct.pack("<I", 99)),
                 "(99) is not a valid GGUFValueType", id="bad-value-type"),
    pytest.param(lambda d, o: _patch(d, 100, b"\xff" * 40), "the metadata (key/value pairs) needs bytes",
                 id="garbage-in-metadata"),
    pytest.param(lambda d, o: _patch(d, o["tensor_info"] + 5, b"\xff" * 40),
                 "the tensor info needs bytes", id="garbage-in-tensor-info"),
    pytest.param(lambda d, o: _patch(d, o["data"] + 100, b"\xff" * 100),
                 "tensor token_embd.weight holds NaN or Inf", id="garbage-in-tensor-data"),
    pytest.param(lambda d, o: _patch(d, o["last_offset"], struct.pack("<Q", 1 << 40)),
                 "the data of tensor output.weight needs bytes", id="data-offset-past-end"),
])
def test_corrupt_gguf(good_gguf, tmp_path, cache, edit, problem):
    from kvlab.model import load_model

    f = tmp_path / "corrupt.gguf"
    f.write_bytes(edit(*good_gguf))
    _expect(ValueError, lambda: load_model(f, cache=False), str(f), problem)
    assert _cached_files(cache) == []


@pytest.mark.parametrize("arch", ["gpt2", "mamba"])
def test_unsupported_gguf_arch(model, tmp_path, arch):
    from kvlab.model import load_gguf

    f = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(f, model, arch=arch)
    _expect(ValueError, lambda: load_gguf(f), str(f),
            f"unsupported GGUF architecture {arch!r}; supported: llama")


@pytest.mark.parametrize("edits,problem", [
    pytest.param({"drop": ["blk.1.attn_k.weight"]}, "missing tensor(s) blk.1.attn_k.weight",
                 id="no-attn_k"),
    pytest.param({"drop": ["output_norm.weight"]}, "missing tensor(s) output_norm.weight",
                 id="no-output_norm"),
    pytest.param({"drop": ["token_embd.weight"]}, "missing tensor token_embd.weight", id="no-token_embd"),
    pytest.param({"drop": ["llama.block_count"]}, "metadata lacks the key llama.block_count",
                 id="no-block_count"),
    pytest.param({"drop": ["llama.embedding_length"]}, "metadata lacks the key llama.embedding_length",
                 id="no-embedding_length"),
    pytest.param({"meta": {"llama.block_count": 1}}, "unexpected tensor(s) blk.1.", id="extra-layer"),
    pytest.param({"meta": {"llama.attention.head_count_kv": 4}},
                 "tensor blk.0.attn_k.weight has shape [32, 64], expected [64, 64]", id="wrong-shape"),
])
def test_gguf_missing_or_mismatched(model, tmp_path, cache, edits, problem):
    from kvlab.model import load_gguf

    f = tmp_path / "bad.gguf"
    write_tiny_gguf(f, model, **edits)
    _expect(ValueError, lambda: load_gguf(f), str(f), problem)
    assert _cached_files(cache) == []


@needs_smollm2
def test_truncated_smollm2(tmp_path):
    """The real file cut short (inside its tokenizer metadata) fails fast and clearly."""
    from kvlab.model import load_model, smollm2_gguf_path

    f = tmp_path / "SmolLM2-cut.gguf"
    with open(smollm2_gguf_path(), "rb") as src:
        f.write_bytes(src.read(64 << 10))
    _expect(ValueError, lambda: load_model(f, cache=False), str(f), "truncated or corrupt",
            "the metadata (key/value pairs) needs bytes", "ends at byte 65536")


# ---- the GGUF disk cache ----------------------------------------------------------------------

def test_failed_load_does_not_poison_cache(model, tmp_path, cache):
    """A bad file leaves no cache entry; an entry for the bad bytes written without validation
    (an older kvlab) is not trusted; the good file at the same path then loads."""
    from kvlab.model import gguf_loader as gl

    f = tmp_path / "m.gguf"
    write_tiny_gguf(f, model, drop=["blk.1.attn_k.weight"])
    _expect(ValueError, lambda: gl.load_gguf(f), str(f), "missing tensor(s) blk.1.attn_k.weight")
    assert _cached_files(cache) == []
    good = tmp_path / "good.gguf"
    write_tiny_gguf(good, model)
    w = gl.load_gguf(good)
    incomplete = gl.GGUFWeights(w.config, {k: v for k, v in w.tensors.items() if k != K1})
    gl._write_disk_cache(gl._disk_cache_base(f, f.stat()), incomplete)
    _expect(ValueError, lambda: gl.load_gguf(f), str(f), "missing tensor(s) blk.1.attn_k.weight")
    shutil.copy(good, f)
    assert gl.load_gguf(f).tensors.keys() == w.tensors.keys()


def _damage(base, suffix: str, data: bytes) -> None:
    (base.parent / (base.name + suffix)).write_bytes(data)


@pytest.mark.parametrize("damage", [
    pytest.param(lambda b: _damage(b, ".safetensors", b"\x08\x00"), id="truncated-safetensors"),
    pytest.param(lambda b: _damage(b, ".json", b"{not json"), id="garbage-json"),
    pytest.param(lambda b: _damage(b, ".json", b'{"config": {"vocab_size": 3}}'), id="wrong-json"),
    pytest.param(lambda b: save_file({"x": torch.zeros(2)}, str(b) + ".safetensors"), id="wrong-tensors"),
])
def test_corrupt_disk_cache_is_rebuilt(model, tmp_path, monkeypatch, damage):
    from kvlab.model import gguf_loader as gl

    f = tmp_path / "m.gguf"
    write_tiny_gguf(f, model)
    want = gl.load_gguf(f)
    base = gl._disk_cache_base(f, f.stat())
    damage(base)
    monkeypatch.setattr(gl, "_MEM_CACHE", {})
    got = gl.load_gguf(f)
    assert got.config == want.config
    assert all(torch.equal(got.tensors[k], v) for k, v in want.tensors.items())
    assert load_file(str(base) + ".safetensors").keys() == want.tensors.keys()  # rewritten


# ---- HF safetensors directories -----------------------------------------------------------------

def _edit_weights(d, change) -> None:
    f = d / "model.safetensors"
    tensors = load_file(str(f))
    change(tensors)
    save_file(tensors, str(f))


def _edit_config(d, change) -> None:
    cfg = json.loads((d / "config.json").read_text())
    change(cfg)
    (d / "config.json").write_text(json.dumps(cfg))


def _cut(f, n: int) -> None:
    f.write_bytes(f.read_bytes()[:n])


BROKEN = "(truncated or corrupt .safetensors file?)"
ST, CFG, INDEX = "model.safetensors", "config.json", "model.safetensors.index.json"


def _case(name: str, breaks, file: str, problem: str):
    """One broken HF directory: `breaks(dir)` damages it; the error names `file` (the
    directory itself when "") and contains `problem`."""
    return pytest.param(breaks, file, problem, id=name)


@pytest.mark.parametrize("breaks,file,problem", [
    _case("missing-k_proj", lambda d: _edit_weights(d, lambda t: t.pop(K1)), "", f"missing tensor(s) {K1}"),
    _case("wrong-shape", lambda d: _edit_weights(d, lambda t: t.update({K1: t[K1][:16]})), "",
          f"tensor {K1} has shape [16, 64], expected [32, 64]"),
    _case("extra-tensor", lambda d: _edit_weights(d, lambda t: t.update({"model.layers.2.x": t[K1].clone()})),
          "", "unexpected tensor(s) model.layers.2.x"),
    _case("nan-weight", lambda d: _edit_weights(d, lambda t: t[K1].__setitem__((0, 0), float("nan"))), ST,
          f"tensor {K1} holds NaN or Inf"),
    _case("config-not-json", lambda d: (d / CFG).write_text("{not json"), CFG, "is not valid JSON"),
    _case("config-not-object", lambda d: (d / CFG).write_text("[1, 2]"), CFG,
          "holds a JSON list, expected an object"),
    _case("config-missing-key", lambda d: _edit_config(d, lambda c: c.pop("hidden_size")), CFG,
          "lacks the key 'hidden_size'"),
    _case("config-wrong-arch", lambda d: _edit_config(d, lambda c: c.update(model_type="gpt2")), CFG,
          "unsupported model_type 'gpt2'"),
    _case("config-bad-value", lambda d: _edit_config(d, lambda c: c.update(num_hidden_layers=0)), CFG,
          "n_layers must be a positive int"),
    _case("config-fewer-layers", lambda d: _edit_config(d, lambda c: c.update(num_hidden_layers=1)), "",
          "unexpected tensor(s) model.layers.1."),
    _case("safetensors-cut-in-length", lambda d: _cut(d / ST, 4), ST, BROKEN),
    _case("safetensors-cut-in-header", lambda d: _cut(d / ST, 100), ST, BROKEN),
    _case("safetensors-cut-in-data", lambda d: _cut(d / ST, 20_000), ST, BROKEN),
    _case("safetensors-garbage", lambda d: (d / ST).write_bytes(b"\x10" + b"\xff" * 40), ST, BROKEN),
    _case("index-not-json", lambda d: (d / INDEX).write_text("{"), INDEX, "is not valid JSON"),
    _case("index-no-weight-map", lambda d: (d / INDEX).write_text("{}"), INDEX, "has no 'weight_map' object"),
])
def test_bad_hf_dir(model, tmp_path, breaks, file, problem):
    from kvlab.model import load_model

    d = write_tiny_hf_dir(tmp_path / "hf", model)
    breaks(d)
    _expect(ValueError, lambda: load_model(d, cache=False), str(d / file) if file else str(d), problem)


def test_hf_dir_without_config(model, tmp_path):
    from kvlab.model import load_hf_dir

    d = write_tiny_hf_dir(tmp_path / "hf", model)
    (d / CFG).unlink()
    _expect(FileNotFoundError, lambda: load_hf_dir(d), str(d), "has no config.json")


def test_good_tiny_files_load(model, tmp_path):
    """The unbroken files the tests above start from load (so each failure is the edit's)."""
    from kvlab.model import load_model

    with pytest.warns(UserWarning, match="tokenizer"):
        hf, _ = load_model(write_tiny_hf_dir(tmp_path / "hf", model), cache=False)
    write_tiny_gguf(tmp_path / "good.gguf", model)
    with pytest.warns(UserWarning, match="tokenizer"):
        g, _ = load_model(tmp_path / "good.gguf", cache=False)
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(g(ids), hf(ids))
