"""The on-disk GGUF conversion cache: keyed by content (not path or mtime) and bounded in size."""
import os
import time

from kvlab.model import gguf_loader as gl


def _fake(path, data: bytes):
    path.write_bytes(data)
    return path, path.stat()


def test_key_follows_content_not_path_or_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_CACHE_DIR", str(tmp_path / "cache"))
    a, sa = _fake(tmp_path / "m.gguf", b"x" * 3_000_000)
    (tmp_path / "other").mkdir()
    b, _ = _fake(tmp_path / "other" / "m.gguf", b"x" * 3_000_000)
    os.utime(b, (sa.st_atime + 1000, sa.st_mtime + 1000))  # a reinstall: same bytes, new mtime
    assert gl._disk_cache_base(a, a.stat()) == gl._disk_cache_base(b, b.stat())
    # one byte changed in the middle (beyond any head/tail window) is a different model
    c, _ = _fake(tmp_path / "c.gguf", b"x" * 1_500_000 + b"y" + b"x" * 1_499_999)
    c = c.rename(tmp_path / "other" / "m2.gguf")
    assert gl._disk_cache_base(c, c.stat()).name.split("-")[-1] != gl._disk_cache_base(a, a.stat()).name.split("-")[-1]
    assert gl._disk_cache_base(a, a.stat()).parent == tmp_path / "cache" / "gguf"


def test_prune_keeps_most_recent_and_drops_old_orphans(tmp_path):
    now = time.time()
    for i in range(5):  # entry i used at now - (5 - i) * 100 s: entry 4 is the newest
        for suf in (".safetensors", ".json"):
            f = tmp_path / f"m-{i}{suf}"
            f.write_text("z")
            os.utime(f, (now - (5 - i) * 100, now - (5 - i) * 100))
    old_orphan = tmp_path / "m-old.safetensors"
    old_tmp = tmp_path / "m-dead.safetensors.tmp123"
    fresh_orphan = tmp_path / "m-writing.safetensors"  # a writer that has not written its JSON yet
    for f in (old_orphan, old_tmp, fresh_orphan):
        f.write_text("z")
    for f in (old_orphan, old_tmp):
        os.utime(f, (now - 7200, now - 7200))
    gl._prune_disk_cache(tmp_path, keep=3)
    left = sorted(f.name for f in tmp_path.iterdir())
    assert left == sorted(
        [f"m-{i}{s}" for i in (2, 3, 4) for s in (".json", ".safetensors")] + ["m-writing.safetensors"]
    )
