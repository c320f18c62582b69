"""The one way a store URL is shown to people: every message, ``repr`` and log line uses :func:`mask_url`.

A URL may carry a password (``postgresql://app:secret@db/shop``, ``redis://:secret@cache``) or a secret in
its query (``?password=...``). Masking works on the text, not on a parsed URL, so a URL too malformed to
parse (the very URLs that end up in error messages) is masked too.
"""

from __future__ import annotations

import re

__all__ = ["mask_url"]

# A query parameter whose name says it holds a secret: password, passwd, sslpassword, pwd, secret, token...
_SECRET_PARAM = re.compile(r"(?i)([?&;][^=&;#]*(?:pass|pwd|secret|token|key)[^=&;#]*=)[^&;#]*")


def mask_url(url: object) -> str:
    """``url`` with the password of its userinfo and every secret query value replaced by ``***``.

    Over-masks rather than leaks: everything before the last ``@`` after ``://`` counts as userinfo (a
    password may hold ``/`` or ``@`` unescaped). Never raises; a non-str is shown by its ``repr``.
    """
    if not isinstance(url, str):
        return repr(url)
    head, sep, tail = url.partition("://")
    if not sep:
        head, tail = "", url
    if "@" in tail:
        creds, _, rest = tail.rpartition("@")
        user, colon, _ = creds.partition(":")
        tail = f"{user}:***@{rest}" if colon else f"{creds}@{rest}"
    return _SECRET_PARAM.sub(r"\1***", f"{head}{sep}{tail}")
