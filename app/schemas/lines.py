"""JSON text that every line-based reader keeps on one line.

JSON leaves U+2028, U+2029 and U+0085 raw inside strings, and `str.splitlines` (so httpx's
`iter_lines`, requests' and many JSONL loaders) ends a line at each of them: a model that
writes one would break its own line in two. Escaped, they read back as the same text.
Used wherever model text goes out one JSON per line: the JSONL export and the SSE streams.
"""

from __future__ import annotations

LINE_BREAKERS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def one_line(json_text: str) -> str:
    """`json_text` (JSON already, with no raw newline) with those three escaped."""
    return json_text.translate(LINE_BREAKERS)
