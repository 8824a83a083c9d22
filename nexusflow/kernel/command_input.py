"""Reading a management command's JSON document argument (a path, or ``-`` for standard input)."""
from __future__ import annotations

import json
import sys
from typing import Any

from django.core.management.base import CommandError


def json_document_argument(file: str, *, invalid_code: str) -> Any:
    """The JSON document in ``file`` (``-``: standard input).

    Raises:
        CommandError: exit code 2; an unreadable file (``cannot read``) or text that is not JSON
            (``<invalid_code>: <file> is not JSON``). Nothing has been written.
    """
    try:
        text = sys.stdin.read() if file == "-" else open(file, encoding="utf-8").read()
    except OSError as exc:
        raise CommandError(f"cannot read {file}: {exc.strerror}", returncode=2) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CommandError(f"{invalid_code}: {file} is not JSON ({exc})", returncode=2) from None
