"""Every number in the paper comes through `Numbers.cite`, which formats it and records where it came from
(a result file and the row/column, or a kvlab computation); `unsourced` finds numbers in the text that did
not, and the build fails on any."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# a number right after a letter, underscore, colon or '#', or after "<alnum>-", is part of a name (q4_0,
# int4:g32, fp8_e4m3, H200, SmolLM2-135M) or a reference (#21038); "4-bit" is a name too. Units after a number
# (32K, 0.47x, 7B) do not make it a name: it must be cited.
_NUMBER = re.compile(r"(?<![A-Za-z_:#/=.\d])(?<![A-Za-z0-9]-)[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?(?![:_\d]|\.\d|-[A-Za-z])")
_SKIP = re.compile(r"`[^`]*`|\]\([^)]*\)|<[^>]*>|https?://\S+")
ALLOWED = {"2024", "2025", "2026"}  # publication years in citations


@dataclass
class Numbers:
    used: dict = field(default_factory=dict)   # formatted text -> [source, ...]

    def cite(self, value, fmt: str, source: str) -> str:
        """`value` formatted with `fmt`, recorded as coming from `source` ("file: row / column")."""
        text = format(value, fmt)
        self.used.setdefault(text.lstrip("+"), []).append(source)
        return text

    def unsourced(self, markdown: str) -> list[str]:
        """Numeric tokens of `markdown` (outside code spans, links and names) that no `cite` produced."""
        bad = []
        for line in markdown.splitlines():
            if line.startswith("#") or line.startswith("!["):
                continue
            text = _SKIP.sub(" ", line)
            for m in _NUMBER.finditer(text):
                tok = m.group(0).lstrip("+").rstrip(",")
                if tok not in self.used and tok.lstrip("-") not in self.used and tok not in ALLOWED:
                    bad.append(f"{tok!r} in: {line.strip()[:100]}")
        return bad
