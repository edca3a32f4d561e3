"""Where an agent step's model calls go and with which key: URL, headers, variables.

A step reaches its provider through the provider's host variables
(``OPENAI_API_KEY``/``OPENAI_BASE_URL``, ``AZURE_OPENAI_API_KEY``/
``AZURE_OPENAI_ENDPOINT``/``OPENAI_API_VERSION``, ``ANTHROPIC_API_KEY``/
``ANTHROPIC_BASE_URL``) or through its own ``endpoint:`` (``base_url``,
``api_key_env``, ``api_version``), so one run can use several servers and
keys. A step's own ``base_url`` never receives the provider's default key:
only the variable its ``api_key_env`` names (a key meant for one server is
not sent to another). ``problems`` says what is missing, for preflight.

A base URL may carry credentials (``http://user:pass@host/v1``, a
``?token=`` query for a proxy). The path of each call is joined inside the
URL's path, with the query kept at the end, and ``shown`` is the URL as it
may be recorded or printed: userinfo and query values replaced by ``***``.

Pure. Standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

#: (key variable, base URL variable) per provider.
PROVIDER_ENV: Mapping[str, tuple[str, str]] = {
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "openai-responses": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "azure": ("AZURE_OPENAI_API_KEY", "AZURE_OPENAI_ENDPOINT"),
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
}
DEFAULT_BASE = {
    "openai": "https://api.openai.com/v1",
    "openai-responses": "https://api.openai.com/v1",
    "anthropic": "https://api.anthropic.com",
}
AZURE_VERSION_ENV = "OPENAI_API_VERSION"
#: The latest generally available Azure OpenAI data-plane version with tools and strict schemas.
AZURE_DEFAULT_VERSION = "2024-10-21"
ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class StepEndpoint:
    """A step's ``endpoint:`` (all optional)."""

    base_url: str | None = None
    api_key_env: str | None = None
    api_version: str | None = None


def step_endpoint(spec: Any) -> StepEndpoint | None:
    """A ``StepEndpoint`` from the workflow's ``endpoint:`` model (None stays None)."""
    if spec is None:
        return None
    return StepEndpoint(getattr(spec, "base_url", None), getattr(spec, "api_key_env", None),
                        getattr(spec, "api_version", None))


@dataclass(frozen=True)
class Target:
    url: str
    key: str | None
    #: the variable the key came from (for messages), or ""
    key_var: str
    #: ``url`` without its credentials, for records and messages (see ``shown``)
    shown: str


#: A query parameter stockade sets itself and that is no credential.
_PLAIN_PARAMS = frozenset({"api-version"})


def url_for(provider: str, base: str, model: str, api_version: str | None = None) -> str:
    parts = urlsplit(base.strip())
    path = parts.path.rstrip("/")
    query = [q for q in parts.query.split("&") if q]
    if provider == "openai":
        path += "/chat/completions"
    elif provider == "openai-responses":
        path += "/responses"
    elif provider == "azure":
        root = path.removesuffix("/openai")
        path = f"{root}/openai/deployments/{quote(model, safe='')}/chat/completions"
        given = [q for q in query if q.partition("=")[0] == "api-version"]
        if api_version or not given:
            query = [q for q in query if q not in given]
            query.append(f"api-version={quote(api_version or AZURE_DEFAULT_VERSION, safe='')}")
    else:
        # ANTHROPIC_BASE_URL is documented without the /v1 suffix; accept both.
        path += "/messages" if path.endswith("/v1") else "/v1/messages"
    return urlunsplit((parts.scheme, parts.netloc, path, "&".join(query), ""))


def shown(url: str) -> str:
    """``url`` fit to record or print: ``http://***@host:port/v1/...?token=***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(a URL that does not parse)"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "&".join(
        q if "=" not in q or q.partition("=")[0] in _PLAIN_PARAMS else q.partition("=")[0] + "=***"
        for q in parts.query.split("&") if q)
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries (password, query values), as written and decoded.

    Masked in every record besides, should a server quote them back.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found: list[str] = []
    userinfo = parts.netloc.rpartition("@")[0]
    if userinfo:
        found.append(userinfo)
        found.append(userinfo.partition(":")[2])
    for q in parts.query.split("&"):
        name, _, value = q.partition("=")
        if value and name not in _PLAIN_PARAMS:
            found.append(value)
    return sorted({v for s in found if s for v in (s, unquote(s))}, key=len, reverse=True)


def resolve(provider: str, model: str, step: StepEndpoint | None, env: Mapping[str, str]) -> Target:
    """The URL and key of a step's calls (``problems`` must be empty first)."""
    step = step or StepEndpoint()
    key_var, base_var = PROVIDER_ENV[provider]
    if step.base_url:
        base = step.base_url
        key_var = step.api_key_env or ""
    else:
        base = env.get(base_var) or DEFAULT_BASE.get(provider, "")
        if step.api_key_env:
            key_var = step.api_key_env
    version = step.api_version or env.get(AZURE_VERSION_ENV) or None
    key = (env.get(key_var) or None) if key_var else None
    url = url_for(provider, base, model, version)
    return Target(url, key, key_var if key else "", shown(url))


def problems(provider: str, step: StepEndpoint | None, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(field, message) for what a run would miss; field is ``model`` or an ``endpoint`` key."""
    step = step or StepEndpoint()
    key_var, base_var = PROVIDER_ENV[provider]
    out: list[tuple[str, str]] = []
    if step.api_key_env and not env.get(step.api_key_env):
        out.append(("api_key_env", f"endpoint.api_key_env names {step.api_key_env}, which is not set "
                                   "in the engine's environment; export it before `stockade run` "
                                   "(the key stays on the host)"))
    if provider == "azure":
        if not step.base_url and not env.get(base_var):
            out.append(("model", f"needs the Azure resource URL: set {base_var} (https://NAME."
                                 "openai.azure.com) or endpoint.base_url"))
        if not step.api_key_env and not env.get(key_var):
            out.append(("model", f"needs {key_var} in the engine's environment "
                                 "(or endpoint.api_key_env); the key stays on the host"))
        return out
    if step.base_url or step.api_key_env:
        return out  # a step's own server may need no key (a local vLLM, llama.cpp, Ollama)
    if not env.get(key_var) and not env.get(base_var):
        out.append(("model", f"needs {key_var} in the engine's environment (or {base_var} for "
                             "a compatible server that needs no key); the key stays on the host"))
    return out


def headers(provider: str, key: str | None) -> dict[str, str]:
    h = {"content-type": "application/json"}
    if provider == "anthropic":
        h["anthropic-version"] = ANTHROPIC_VERSION
        if key:
            h["x-api-key"] = key
    elif provider == "azure":
        if key:
            h["api-key"] = key
    elif key:
        h["authorization"] = f"Bearer {key}"
    return h
