"""What goes over the wire to an OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp).

LangChain's `ChatOpenAI` writes an assistant turn that called tools with `content: null` and leaves
`tool_choice` out. OpenAI accepts both; llama.cpp's server answers HTTP 500 to the first ("Expected
'content' to be a string or an array"), and some servers only call tools when asked to choose. So
every request body passes `wire_payload` on its way out, streamed or not, whichever tools the graph
bound for the request.
"""
from __future__ import annotations

from typing import Any

from langchain_openai import ChatOpenAI


def wire_payload(payload: dict[str, Any]) -> dict[str, Any]:
    """The request body as every compatible server accepts it: `tool_choice="auto"` whenever tools
    are offered (unless the caller chose), and `content: ""` on an assistant turn whose content is null."""
    if payload.get("tools") and not payload.get("tool_choice"):
        payload["tool_choice"] = "auto"
    for message in payload.get("messages") or []:
        if message.get("role") == "assistant" and message.get("content") is None:
            message["content"] = ""
    return payload


class CompatibleChatOpenAI(ChatOpenAI):
    """ChatOpenAI whose request bodies pass `wire_payload`."""

    def _get_request_payload(self, input_: Any, *, stop: list[str] | None = None, **kwargs: Any) -> dict:
        return wire_payload(super()._get_request_payload(input_, stop=stop, **kwargs))
