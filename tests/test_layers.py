"""The layer rules of DESIGN.md section 1, checked on the source (AST), not by convention.

The module graph counts every import (top level or inside a function, relative or absolute) and every
string that names a kvlab module (`importlib.import_module("kvlab.x")`, lazy-attribute tables), so a
rule cannot be kept in form only."""
import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1] / "kvlab"
# quality tower: spec <- quant <- cache <- eval, with model beside eval; speed tower: cache <- kernels;
# top: sweep and export use both towers. Each package may import only the packages listed for it.
ALLOWED = {
    "spec": set(),
    "quant": {"spec"},
    "cache": {"spec", "quant"},
    "model": set(),
    "eval": {"spec", "quant", "cache", "model"},
    "kernels": {"spec", "quant", "cache"},
    "report": {"spec"},
    "sweep": {"spec", "quant", "cache", "model", "eval", "kernels", "report"},
    "export": {"spec", "quant", "cache", "model", "eval", "kernels"},
    "paper": {"spec", "quant", "eval", "report", "export"},
    "generate": {"spec", "cache", "model", "eval", "kernels"},
}
KERNEL_LEAVES = {"checks", "configs", "env", "paged", "tiles"}  # what a backend file may import from kvlab.kernels
BACKENDS = {"reference.py", "triton.py", "gluon.py", "gluon_codecs.py"}


def _is_backend(name: str) -> bool:
    """A backend file: one of BACKENDS, or a Triton backend's own further kernels beside it (`triton_*.py`, which may
    use its `triton.py`'s helpers: the same backend in two files, not two backends)."""
    return name in BACKENDS or name.startswith("triton_")


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


MODS = _modules()


def _resolve(name: str) -> str | None:
    bits = name.split(".")
    for i in range(len(bits), 0, -1):
        if ".".join(bits[:i]) in MODS:
            return ".".join(bits[:i])
    return None


def _imports(mod: str) -> set[str]:
    """kvlab modules that `mod` imports or names in a string."""
    path = MODS[mod]
    pkg = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else [])) if node.level \
                else (node.module or "")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODS else base for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"kvlab(\.\w+)+", node.value):
            names = [node.value]
        for n in names:
            r = _resolve(n)
            if r and r != mod:
                out.add(r)
    return out


GRAPH = {m: _imports(m) for m in MODS}


def _pkg(mod: str) -> str | None:
    bits = mod.split(".")
    return bits[1] if len(bits) > 1 else None


def test_no_import_loops():
    """Tarjan's strongly connected components of the module graph: every one is a single module."""
    index, low, stack, on, loops, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                loops.append(sorted(comp))
    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not loops, "import loops:\n" + "\n".join(" <-> ".join(c) for c in loops)


def test_imports_go_one_way():
    bad = []
    for mod, deps in GRAPH.items():
        me = _pkg(mod)
        if me not in ALLOWED:
            continue
        for d in deps:
            other = _pkg(d)
            if other in ALLOWED and other != me and other not in ALLOWED[me]:
                bad.append(f"{mod} -> {d}")
    assert not bad, "layer violations:\n" + "\n".join(sorted(bad))


def test_cache_never_names_the_kernels():
    """cache/ takes a store function; it does not reach the kernels, not even in a string or comment."""
    bad = [str(p) for p in (ROOT / "cache").rglob("*.py") if re.search(r"kvlab\.kernels|\.\.kernels", p.read_text())]
    assert not bad, bad


def test_backends_import_only_shared_leaves():
    """Backend files never import each other, an api.py, the tuned store or the autotune driver."""
    bad = []
    for mod, path in MODS.items():
        if not mod.startswith("kvlab.kernels.") or not _is_backend(path.name):
            continue
        folder = mod.rsplit(".", 1)[0]
        for d in GRAPH[mod]:
            if not d.startswith("kvlab.kernels"):
                continue
            leaf = d.split(".")[2] if d.count(".") >= 2 else ""
            same_folder_codecs = d == f"{folder}.gluon_codecs" and path.name == "gluon.py"
            own_triton = d == f"{folder}.triton" and path.name.startswith("triton_")
            if leaf not in KERNEL_LEAVES and not same_folder_codecs and not own_triton:
                bad.append(f"{mod} -> {d}")
    assert not bad, "backend imports beyond the shared leaves:\n" + "\n".join(sorted(bad))


def test_tuned_store_and_leaves_import_no_kernel_code():
    bad = []
    for mod in ("kvlab.kernels.tuned", "kvlab.kernels.configs", "kvlab.kernels.env", "kvlab.kernels.checks",
                "kvlab.kernels.paged"):
        bad += [f"{mod} -> {d}" for d in GRAPH[mod] if d.startswith("kvlab.kernels") and
                d.split(".")[2] not in KERNEL_LEAVES - {"tiles"}]
    assert not bad, bad


def test_only_api_and_the_driver_reach_backends():
    """A backend module is imported only by its folder's api.py (and the autotune driver, above the apis)."""
    bad = []
    for mod, deps in GRAPH.items():
        for d in deps:
            if d.startswith("kvlab.kernels.") and _is_backend(MODS[d].name) and MODS[d].name != "gluon_codecs.py":
                ok = mod == d.rsplit(".", 1)[0] + ".api" or mod == "kvlab.kernels.autotune"
                ok = ok or (MODS.get(mod) is not None and MODS[mod].name.startswith("triton_")
                            and d == mod.rsplit(".", 1)[0] + ".triton")  # a Triton backend's own further kernels
                if not ok:
                    bad.append(f"{mod} -> {d}")
    assert not bad, bad


def test_reference_and_triton_stay_apart():
    bad = []
    for mod, path in MODS.items():
        if path.name == "reference.py" and re.search(r"^\s*(import|from)\s+triton", path.read_text(), re.M):
            bad.append(f"{mod} imports triton")
    assert not bad, bad


def test_spec_has_no_torch_at_module_top():
    for path in (ROOT / "spec").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] == "torch" for n in names), f"{path} imports torch at top"
