"""Which fsspec filesystem a URL names, set up the way the AWS tools are, and its errors said in
one line.

fsspec, s3fs and the other filesystems are optional (`pip install 'batchrun[s3]'`): they are
imported only when a URL is given, and a missing one is named with the command that installs it.
Credentials, profiles and endpoints are botocore's own (AWS_ACCESS_KEY_ID, AWS_PROFILE,
AWS_ENDPOINT_URL, ~/.aws/config ...): batchrun adds no flag for what the AWS tools already take.
"""

from __future__ import annotations

import gc
import os
import re
import sys
import traceback
from typing import TYPE_CHECKING, Any

from batchrun.errors import BatchrunError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

S3_SCHEMES = ("s3", "s3a")
S3_INSTALL = "pip install 'batchrun[s3]'"
# Schemes that can only be read: export --to refuses them before writing anything.
READ_ONLY_SCHEMES = ("http", "https")
# Schemes whose files live in this process's memory: gone when it exits, so never a destination.
PROCESS_SCHEMES = ("memory",)
# What a scheme looks like: two letters or more (so that C:\ stays a Windows path).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+)://")


def url_scheme(text: str) -> str | None:
    """The scheme of `text` when it is a URL (`s3://...`), else None (a local path)."""
    match = _URL.match(text)
    return match.group(1).lower() if match else None


def open_filesystem(url: str, bad_url_exit: int = 1) -> tuple[AbstractFileSystem, str]:
    """The filesystem for `url` and the path within it.

    Raises BatchrunError naming the package to install when the scheme's filesystem is not
    installed, or when no fsspec filesystem knows the scheme; and, with exit code
    `bad_url_exit`, when the filesystem cannot be opened on the URL (a host that is not there).
    """
    scheme = url_scheme(url) or "file"
    try:
        import fsspec
    except ImportError:
        raise BatchrunError(
            f"{url}: reading URLs needs fsspec; install it with {S3_INSTALL}"
        ) from None
    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ValueError:
        raise BatchrunError(f"{url}: no installed filesystem reads {scheme}:// URLs") from None
    except ImportError:
        raise BatchrunError(f"{url}: {scheme}:// URLs need {_install_hint(scheme)}") from None
    # A backend's own set-up may fail too: a bad profile name, a config file it cannot read, a
    # host that does not resolve. What the URL itself says (an FTP or SFTP host, port and user)
    # is the backend's to read: without it FTPFileSystem says its host is missing.
    try:
        fs = cls(skip_instance_cache=True, **cls._get_kwargs_from_urls(url), **_options(scheme))
    except Exception as e:
        message = f"{url}: {cause(e)}"
        _drop_quietly(e)
        raise BatchrunError(message, exit_code=bad_url_exit) from None
    if scheme in S3_SCHEMES:
        # One set of retries, botocore's (AWS_MAX_ATTEMPTS, AWS_RETRY_MODE), as the AWS tools
        # have: s3fs's own (5) around each of botocore's (5 by default) made 25 tries, 25 read
        # time-outs before an endpoint that stopped answering was given up on. A download cut
        # off mid-body is read again by storage/fetch.py.
        fs.retries = 1
    return fs, cls._strip_protocol(url)


def _drop_quietly(error: BaseException) -> None:
    """Let go of a filesystem whose set-up failed, saying nothing: the half-made object is held
    by the error's frames, and its finaliser may fail on what was never made
    (FTPFileSystem.__del__ closes a connection it never opened), a traceback on stderr at exit."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        traceback.clear_frames(error.__traceback__)
        error.__traceback__ = None
        gc.collect()
    finally:
        sys.unraisablehook = hook


def _install_hint(scheme: str) -> str:
    """What installs the filesystem of `scheme`: batchrun's extra for S3, else fsspec's package."""
    if scheme in S3_SCHEMES:
        return f"s3fs: install it with {S3_INSTALL}"
    from fsspec.registry import known_implementations

    spec = known_implementations.get(scheme, {})
    package = str(spec.get("class", "")).split(".")[0].replace("_", "-")
    return f"the package {package}: pip install {package}" if package else "a filesystem package"


def _options(scheme: str) -> dict[str, Any]:
    """The filesystem's options: for S3, the endpoint from the environment (as the AWS tools
    take it) and time-outs in which a store that does not answer is noticed."""
    if scheme not in S3_SCHEMES:
        return {}
    options: dict[str, Any] = {
        # botocore's defaults (60 s each) leave an endpoint that does not answer unnoticed for
        # 5 minutes through its 5 tries; with these, 50 s (no connection) or 2.5 minutes (a
        # connection, and no answer). S3 sends at least a keep-alive byte well within 30 s.
        "config_kwargs": {"connect_timeout": 10, "read_timeout": 30},
    }
    # botocore 1.31 and later read these itself; older ones do not, so pass them on (the same
    # precedence: the S3-specific one first, and none when configured endpoints are ignored).
    ignore = os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").lower() == "true"
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint and not ignore:
        options["endpoint_url"] = endpoint
    return options


# A store not reached, or lost on the way: aiohttp's errors, the socket's, a time-out.
_UNREACHED = {
    "ClientConnectionError",
    "ConnectionError",
    "gaierror",
    "TimeoutError",
    "FSTimeoutError",
}


def cause(error: BaseException) -> str:
    """Why a store refused or failed, in words (one line), from the error its client raised."""
    names = _names(error)
    text = " ".join(str(error).split()) or type(error).__name__
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        return (
            "no AWS credentials found (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            "or AWS_PROFILE)"
        )
    if names & {"ProfileNotFound"}:
        return f"{text} (AWS_PROFILE names a profile ~/.aws/config does not have)"
    if names & {"gaierror", "ClientConnectorDNSError"}:  # a host name that does not resolve
        return f"the host is not known ({text})"
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError"}:
        return f"the endpoint does not answer ({text})"
    if names & {"ClientPayloadError", "IncompleteRead", "ServerDisconnectedError", "ClientOSError"}:
        return f"the connection was lost ({text})"
    if names & {"ReadTimeoutError", "TimeoutError", "FSTimeoutError", "ConnectionRefusedError"}:
        return f"the endpoint does not answer ({text})"
    if isinstance(error, PermissionError):
        return f"access denied ({text}); check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE)"
    if isinstance(error, FileNotFoundError):
        # fsspec's HTTP filesystem says FileNotFoundError for any look-up that failed, a server
        # that is down or a host not known too: the connection's error, its cause, says which.
        reason = error.__cause__
        if reason is not None and _names(reason) & _UNREACHED:
            return cause(reason)
        if "bucket" in text.lower():
            return "the bucket does not exist"
        return "no such object"
    return text


def _names(error: BaseException) -> set[str]:
    """The names of the error's class and its bases: each client's errors, without importing it."""
    return {cls.__name__ for cls in type(error).__mro__}
