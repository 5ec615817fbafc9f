"""Which language model drives the ops agent, and how a bad setting is reported.

Settings come, strongest first, from the command line, environment variables
(`TRAINOPS_PROVIDER`, `TRAINOPS_MODEL`, `TRAINOPS_BASE_URL`, `TRAINOPS_API_KEY_ENV`), the
`[agent]` table of the settings files (trainops.settings: project-local `./trainops.toml`, the
workspace's, the user's own config), and the default: the offline SOP policy, which needs no
network and no key. Every setting remembers where it came from, so an error can name the exact
knob to turn. `base_url` (where prompts and the key go) and `api_key_env` (which secret is sent)
are taken only from the user's own config, the environment or the command line: a cloned
repository's trainops.toml must not send `$AWS_SECRET_ACCESS_KEY` to its own server, so such a
file is refused unless the user trusts its folder.
"""
from __future__ import annotations

import os
import re
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from trainops.redact import REDACTED, scrub
from trainops.settings import SettingsError, table, untrusted_keys, user_config_path

Provider = Literal["offline", "openai", "anthropic"]

_DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
_DEFAULT_MODEL = {"offline": "sop-policy", "openai": "gpt-4o-mini", "anthropic": "claude-sonnet-4-5"}
_ENV = {"provider": "TRAINOPS_PROVIDER", "model": "TRAINOPS_MODEL", "base_url": "TRAINOPS_BASE_URL",
        "api_key_env": "TRAINOPS_API_KEY_ENV", "timeout_s": "TRAINOPS_TIMEOUT_S", "max_turns": "TRAINOPS_MAX_TURNS",
        "max_tokens": "TRAINOPS_MAX_TOKENS"}


class ProviderError(Exception):
    """The chosen model cannot be used: names the setting, the value seen and the fix. The message
    is scrubbed of secrets as it is made (a provider's answer may echo the key), so neither the
    terminal, the log, the LangGraph checkpoint in agent.sqlite nor the model ever holds one."""
    def __init__(self, message: str):
        super().__init__(scrub(message))


class AgentSettings(BaseModel):
    provider: Provider = Field("offline",
                               description="offline (deterministic SOP policy), openai (any OpenAI-compatible server) "
                                           "or anthropic")
    model: str = Field("", description="model name sent to the provider; empty means the provider's default")
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1 for vLLM")
    api_key_env: str | None = Field(None, description="environment variable that holds the API key")
    timeout_s: float = Field(60.0, gt=0, description="per-request timeout of the provider client")
    max_turns: int = Field(25, ge=1, le=200,
                           description="model turns one request may take; spent, the run stops and says so")
    max_tokens: int | None = Field(None, gt=0,
                                   description="prompt + completion tokens one request may use (a model that "
                                               "reports usage); spent, the run stops and says so; none: no limit")
    sources: dict[str, str] = Field(default_factory=dict, description="setting -> where its value came from")

    def source(self, key: str) -> str:
        return self.sources.get(key, "default")

    @property
    def key_env(self) -> str:
        return self.api_key_env or _DEFAULT_KEY_ENV.get(self.provider, "")


SECURITY_KEYS = ("base_url", "api_key_env")


def _refuse_untrusted(sources: dict[str, str], untrusted: dict[str, str]) -> None:
    """A security key whose effective value comes from a file the user has not trusted is refused."""
    for key in SECURITY_KEYS:
        if key in untrusted and sources.get(key) == untrusted[key]:
            raise ProviderError(
                f"{untrusted[key]} is not trusted: a project-local or workspace trainops.toml cannot choose where the "
                f"agent connects or which secret it sends; set {key} in your own config ({user_config_path()}) or "
                f"{_ENV[key]}, or, if you trust that folder, list it under [trust] folders in {user_config_path()}")


def load_settings(provider: str | None = None, model: str | None = None, base_url: str | None = None) -> AgentSettings:
    """Merge flag > environment > settings files > default, remembering each value's source."""
    try:
        values, sources = table("agent")
        untrusted = untrusted_keys("agent")
    except SettingsError as exc:
        raise ProviderError(str(exc)) from None
    for key, var in _ENV.items():
        if os.environ.get(var):
            values[key] = os.environ[var]
            sources[key] = f"environment variable {var}"
    for key, value in (("provider", provider), ("model", model), ("base_url", base_url)):
        if value:
            values[key] = value
            sources[key] = f"--{key.replace('_', '-')}"
    _refuse_untrusted(sources, untrusted)
    chosen = values.get("provider", "offline")
    if chosen not in ("offline", "openai", "anthropic"):
        raise ProviderError(
            f"provider {chosen!r} (from {sources.get('provider', 'default')}) is not known; "
            "use offline, openai or anthropic"
        )
    unknown = set(values) - (set(AgentSettings.model_fields) - {"sources"})
    if unknown:
        raise ProviderError(f"unknown [agent] setting(s) {sorted(unknown)}; known: "
                            f"{', '.join(k for k in AgentSettings.model_fields if k != 'sources')}")
    try:
        return AgentSettings(**values, sources=sources)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0])
        raise ProviderError(f"agent setting {field}={err.get('input')!r} (from {sources.get(field, 'default')}) "
                            f"is not valid: {err['msg']}") from None


def make_chat_model(settings: AgentSettings):
    """Build the LangChain chat model; a missing key fails here, before any request."""
    if settings.provider == "offline":
        from trainops.agents.policy import OfflinePolicy

        return OfflinePolicy()
    key = os.environ.get(settings.key_env, "")
    if not key:
        hint = (" (local servers such as vLLM, SGLang or llama.cpp accept any value, e.g. EMPTY)"
                if settings.provider == "openai" else "")
        raise ProviderError(
            f"provider {settings.provider} needs an API key: environment variable {settings.key_env} is not set{hint}; "
            "set it, or name another variable with [agent] api_key_env in your config / TRAINOPS_API_KEY_ENV"
        )
    model = settings.model or _DEFAULT_MODEL[settings.provider]
    if settings.provider == "openai":
        from trainops.agents.openai_wire import CompatibleChatOpenAI

        return CompatibleChatOpenAI(model=model, api_key=key, base_url=settings.base_url, timeout=settings.timeout_s,
                          max_retries=0)
    from langchain_anthropic import ChatAnthropic

    extra = {"base_url": settings.base_url} if settings.base_url else {}
    return ChatAnthropic(model=model, api_key=key, timeout=settings.timeout_s, max_retries=0, **extra)


_BODY_CHARS = 300
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{6,}")
_KEYED_SECRET = re.compile(r"(?i)((?:api[ _-]?key|access[ _-]?token|token|secret|password|authorization)"
                           r"(?:\s+provided)?['\"]?\s*[:=]\s*['\"]?)([^'\"\s,;}]+)")


def provider_body(text: object, key: str = "") -> str:
    """A provider's error body as one short line that holds no secret: the key in use, anything shaped
    like a key, bearer credentials and `key=value` secrets are redacted, then it is cut at 300 characters."""
    out = str(text)
    if len(key) >= 4:
        out = out.replace(key, REDACTED)
    out = _KEYED_SECRET.sub(lambda m: m.group(1) + REDACTED, _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", out))
    out = " ".join(scrub(out).split())
    return out if len(out) <= _BODY_CHARS else out[:_BODY_CHARS] + "…"


def _names(exc: BaseException) -> set[str]:
    """The class names of the exception and of what caused it (the HTTP client's own error)."""
    names: set[str] = set()
    while exc is not None and not names & {"ConnectTimeout", "ConnectError"}:
        names |= {cls.__name__ for cls in type(exc).__mro__}
        exc = exc.__cause__ or exc.__context__
    return names


def _body(exc: Exception, key: str) -> str:
    response = getattr(exc, "response", None)
    text = getattr(response, "text", None) if response is not None else None
    return provider_body(text or getattr(exc, "message", None) or exc, key) or "(empty body)"


def explain_provider_failure(settings: AgentSettings, exc: Exception) -> ProviderError:
    """Turn a client's failure into one line that says which it was (timeout, unreachable endpoint,
    refused key, server error, other HTTP error), names the setting to fix, and quotes at most 300
    redacted characters of what the server said."""
    names, key = _names(exc), os.environ.get(settings.key_env, "")
    where = settings.base_url or "the provider's default URL"
    status = getattr(exc, "status_code", None)
    model = settings.model or _DEFAULT_MODEL[settings.provider]
    if names & {"ConnectTimeout", "ConnectError"} or ("APIConnectionError" in names and "APITimeoutError" not in names):
        return ProviderError(
            f"cannot reach the {settings.provider} endpoint at base_url={where} (from {settings.source('base_url')}): "
            f"{provider_body(exc, key)}; start the server or fix base_url ([agent] base_url in your config or "
            "TRAINOPS_BASE_URL)")
    if names & {"APITimeoutError", "ReadTimeout", "TimeoutException"}:
        return ProviderError(
            f"the {settings.provider} endpoint at base_url={where} did not answer within timeout_s="
            f"{settings.timeout_s:g} s (from {settings.source('timeout_s')}): it accepted the connection but is slow "
            "or stuck (a model still loading, a long prompt); check the server's load, or raise timeout_s ([agent] "
            "timeout_s in your config or TRAINOPS_TIMEOUT_S)")
    if names & {"AuthenticationError", "PermissionDeniedError"} or status in (401, 403):
        return ProviderError(
            f"the {settings.provider} endpoint refused the API key in {settings.key_env} (HTTP {status}): "
            f"{_body(exc, key)}; set a valid key in {settings.key_env}, or name another variable with [agent] "
            "api_key_env in your config / TRAINOPS_API_KEY_ENV")
    if "NotFoundError" in names or status == 404:
        return ProviderError(
            f"the {settings.provider} endpoint answered 404 for model={model!r} (from {settings.source('model')}) at "
            f"base_url={settings.base_url or 'default'}: {_body(exc, key)}; the model name or the base_url path "
            "(usually ending in /v1) is wrong: fix [agent] model / base_url or TRAINOPS_MODEL / TRAINOPS_BASE_URL")
    if isinstance(status, int) and status >= 500:
        return ProviderError(
            f"the {settings.provider} endpoint at base_url={where} answered with a server error (HTTP {status}): "
            f"{_body(exc, key)}; the server failed on this request: check its log (model={model!r} from "
            f"{settings.source('model')})")
    if isinstance(status, int):
        return ProviderError(
            f"the {settings.provider} endpoint at base_url={where} refused the request (HTTP {status}): "
            f"{_body(exc, key)}; check the model name ({settings.source('model')}) and what the server supports")
    # any other failure of the client is still one scrubbed line: its text may quote the request
    return ProviderError(f"the {settings.provider} call failed ({type(exc).__name__}: {provider_body(exc, key)}); "
                         f"check the provider settings ({settings.source('model')}) and the server's log")
