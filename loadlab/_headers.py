"""Headers a user gives: refused when they could inject, redacted when they hold a credential.

Three rules for what a user puts on the wire:

- a header name or value holding CR, LF or NUL is refused (``check_header``): written as is,
  it would end the header early and smuggle in another header or a second request;
- URL user-info (``http://user:pass@host``) leaves the URL at once (``split_userinfo``): the
  URL is then safe to store and print, and the credentials travel only as a Basic
  ``Authorization`` header, in memory, on either transport;
- a header named like a credential (``is_credential``: ``authorization``, ``cookie``, any name
  holding ``auth``, ``key``, ``token``, ``secret``, ``passw`` or ``credential``, plus the names
  a user adds with ``--redact-header``) is stored and printed as ``***`` (``redact_headers``).

Usage::

    check_header("X-Trace", "abc")                     # ConfigError if it holds CR, LF or NUL
    url, auth = split_userinfo("http://u:p@h:8000")    # ("http://h:8000", "Basic dTpw")
    redact_headers({"X-Custom-Auth": "s", "X-Trace": "t"})  # {"X-Custom-Auth": "***", ...}
    public_url("http://u:p@h/metrics")                 # "http://h/metrics"
"""

from __future__ import annotations

import base64
import re
import urllib.request
from collections.abc import Iterable, Mapping
from urllib.parse import unquote, urlsplit, urlunsplit

from loadlab.errors import ConfigError

__all__ = [
    "REDACTED",
    "check_header",
    "check_no_proxy",
    "check_url",
    "env_proxy",
    "is_credential",
    "public_url",
    "redact_headers",
    "split_userinfo",
]

REDACTED = "***"
_CREDENTIAL = re.compile(r"auth|key|token|secret|cookie|passw|credential", re.IGNORECASE)
_FORBIDDEN = re.compile(r"[\r\n\x00]")
# RFC 9110 5.1: a field name is a token; a space or colon in one is an error, not a name.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def check_header(name: str, value: str) -> None:
    """Raise ``ConfigError`` (naming the header, not its value) unless it is safe to send."""
    if _FORBIDDEN.search(name) or _FORBIDDEN.search(value):
        raise ConfigError(
            f"header {name!r} holds a CR, LF or NUL character, which would inject another "
            "header into the request; remove it"
        )
    if not _TOKEN.fullmatch(name):
        raise ConfigError(f"header name {name!r} is not a valid HTTP token (letters, digits, -)")


def is_credential(name: str, extra: Iterable[str] = ()) -> bool:
    """Whether header ``name`` is redacted: credential-like, or one of ``extra`` (any case)."""
    lowered = name.lower()
    return bool(_CREDENTIAL.search(name)) or any(lowered == e.lower() for e in extra)


def redact_headers(headers: Mapping[str, str], extra: Iterable[str] = ()) -> dict[str, str]:
    """A copy of ``headers`` with every credential's value replaced by ``***``."""
    names = tuple(extra)
    return {k: REDACTED if is_credential(k, names) else v for k, v in headers.items()}


def split_userinfo(url: str) -> tuple[str, str | None]:
    """``url`` without its user-info, and the ``Authorization`` value that carries it (None
    when the URL has none). Percent-escapes in the user-info are decoded, as browsers do."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    return urlunsplit(parts._replace(netloc=hostport)), f"Basic {token}"


def check_url(url: str, what: str) -> None:
    """``ConfigError`` naming ``what`` (``--endpoint``, ``--scrape``) unless ``url`` is an
    http(s) URL with a host and, when it gives one, a port from 1 to 65535.

    >>> check_url("http://127.0.0.1:8000", "--endpoint")
    >>> check_url("http://127.0.0.1:99999", "--endpoint")
    Traceback (most recent call last):
    loadlab.errors.ConfigError: --endpoint 'http://127.0.0.1:99999': the port must be 1 to 65535
    """
    _, at, tail = url.rpartition("@")  # never print user-info, even of a URL this bad
    shown = url.split("//", 1)[0] + "//***@" + tail if at else url
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Invalid IPv6 URL", "Port out of range 0-65535", ...
        why = "the port must be 1 to 65535" if "Port" in str(exc) else f"not a URL ({exc})"
        raise ConfigError(f"{what} {shown!r}: {why}") from None
    example = "e.g. http://127.0.0.1:8000"
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"{what} {shown!r} must start with http:// or https:// ({example})")
    if not parts.hostname:
        raise ConfigError(f"{what} {shown!r} names no host ({example})")
    if port == 0:
        raise ConfigError(f"{what} {shown!r}: the port must be 1 to 65535")


def public_url(url: str) -> str:
    """``url`` safe to store or print: any user-info removed."""
    return split_userinfo(url)[0]


def env_proxy(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``HTTP_PROXY`` for http, ``HTTPS_PROXY``
    for https), or None when there is none or ``NO_PROXY`` exempts its host: the rule aiohttp
    follows with ``trust_env``. The proxy comes back without its user-info."""
    parts = urlsplit(url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return split_userinfo(proxy)[0]


def check_no_proxy(url: str) -> None:
    """``ConfigError`` when the environment names a proxy for ``url``: for loadlab's own
    (raw) transport, which does not go through one and must not bypass it unseen."""
    proxy = env_proxy(url)
    if proxy is not None:
        raise ConfigError(
            f"{urlsplit(url).scheme.upper()}_PROXY names a proxy ({proxy}) for {url}, and the "
            "raw transport does not go through proxies: add --transport aiohttp to use it, or "
            "add the host to NO_PROXY to reach the endpoint directly"
        )
