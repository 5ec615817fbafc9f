"""The agent's threads as stored in the workspace's SQLite database: who asked what, and which
threads wait for a human. Read by `trainops threads` and the `list_pending_approvals` tool, without
loading the agent graph."""
from __future__ import annotations

import sqlite3

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from pydantic import BaseModel, Field

from trainops.agents.transcript import transcript_path
from trainops.workspace import agent_db_path, is_valid_id


class ThreadInfo(BaseModel):
    thread_id: str
    updated: str = Field(description="time of the thread's latest checkpoint (UTC, ISO 8601)")
    messages: int
    first_request: str
    pending_approvals: int
    waiting_tools: list[str] = Field(default_factory=list, description="tools whose calls wait for a decision")
    transcript: str = Field(description="JSONL of the thread's messages, tool calls and gate decisions (none for "
                                        "a thread id trainops cannot have made)")


def list_threads() -> list[ThreadInfo]:
    """Every thread in the workspace's agent database, newest first."""
    path = agent_db_path()
    if not path.exists():
        return []
    conn = sqlite3.connect(str(path), check_same_thread=False)
    try:
        saver = SqliteSaver(conn)
        saver.setup()
        ids = [row[0] for row in conn.execute("SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = ''")]
        infos = []
        for thread_id in ids:
            found = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}})
            if found is None:
                continue
            messages = found.checkpoint["channel_values"].get("messages", [])
            first = next((str(m.content) for m in messages if isinstance(m, HumanMessage)), "")
            waiting = [item for _task, channel, value in (found.pending_writes or []) if channel == "__interrupt__"
                       for item in (value if isinstance(value, (list, tuple)) else [value])]
            tools = [str(item.value.get("tool")) for item in waiting if isinstance(getattr(item, "value", None), dict)]
            infos.append(ThreadInfo(thread_id=thread_id, updated=found.checkpoint["ts"], messages=len(messages),
                                    first_request=first[:120], pending_approvals=len(waiting), waiting_tools=tools,
                                    transcript=str(transcript_path(thread_id)) if is_valid_id(thread_id) else ""))
    finally:
        conn.close()
    return sorted(infos, key=lambda info: info.updated, reverse=True)
