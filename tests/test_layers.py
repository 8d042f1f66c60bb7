"""The layer rules of DESIGN.md section 1, checked on the source (AST), not by convention."""
import ast
import pathlib

ORDER = ["spec", "quant", "cache", "kernels", "model", "eval", "sweep", "export"]
RANK = {p: i for i, p in enumerate(ORDER)}
RANK["export"] = RANK["sweep"]  # sweep and export sit side by side at the top
ROOT = pathlib.Path(__file__).resolve().parents[1] / "kvlab"


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    pkg = path.relative_to(ROOT).parts
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = list(pkg[:-1])[: len(pkg) - node.level]
                mod = ".".join(["kvlab", *base] + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod
            for a in node.names:  # "from .. import quant" style
                yield f"{mod}.{a.name}"


def test_imports_go_one_way():
    bad = []
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if len(parts) < 2 or parts[0] not in RANK:
            continue
        me = RANK[parts[0]]
        for mod in _imports(path):
            bits = mod.split(".")
            if bits[0] == "kvlab" and len(bits) > 1 and bits[1] in RANK:
                if RANK[bits[1]] > me or (bits[1] in ("sweep", "export") and bits[1] != parts[0]):
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "layer violations:\n" + "\n".join(bad)


def test_reference_and_triton_stay_apart():
    bad = []
    for path in (ROOT / "kernels").rglob("*.py"):
        mods = list(_imports(path))
        if path.name == "reference.py" and any(m.split(".")[0] == "triton" for m in mods):
            bad.append(f"{path} imports triton")
        if path.name == "triton.py" and any(m.endswith("reference") or ".reference." in m for m in mods):
            bad.append(f"{path} imports reference")
    assert not bad, bad


def test_spec_has_no_torch_at_module_top():
    for path in (ROOT / "spec").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] == "torch" for n in names), f"{path} imports torch at top"
