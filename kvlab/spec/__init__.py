"""kvlab.spec: scheme DSL, `KVQuantSpec`, `KVScheme`, presets and grids. Pure Python (no torch)."""
from .dsl import as_spec, format_spec, parse_spec
from .grid import expand, grid
from .presets import ALL_PRESETS, SCHEME_PRESETS, SPEC_PRESETS
from .quant_spec import KVQuantSpec, bit_planes
from .scheme import KVScheme, parse_scheme


def scheme(text_or_dict) -> KVScheme:
    """A `KVScheme` from DSL text, a preset name, a `KVScheme`, or a `to_dict()` mapping / JSON file path.
    Inside kvlab it goes by `as_scheme` (beside `as_spec`), where `scheme` often names a variable."""
    if isinstance(text_or_dict, KVScheme):
        return text_or_dict
    if isinstance(text_or_dict, dict):
        return KVScheme.from_dict(text_or_dict)
    if isinstance(text_or_dict, str) and text_or_dict.endswith(".json"):
        import json
        import os
        if not os.path.exists(text_or_dict):
            raise ValueError(f"scheme file {text_or_dict!r} does not exist")
        with open(text_or_dict) as f:
            return KVScheme.from_dict(json.load(f))
    return parse_scheme(text_or_dict)


as_scheme = scheme

__all__ = ["KVQuantSpec", "KVScheme", "scheme", "as_scheme", "as_spec", "parse_spec", "format_spec", "parse_scheme", "grid", "expand",
           "SPEC_PRESETS", "SCHEME_PRESETS", "ALL_PRESETS", "bit_planes"]
