"""`taskcard mcp`: a stdio MCP server exposing the one `task_card` tool.

The server itself owns no watch: every call goes to the workdir's background host (started on
demand), so a watch keeps refreshing after the MCP client disconnects. The tool's input schema
is `envelope_json_schema()`, generated from the same pydantic models the host validates with.
"""

from __future__ import annotations

import json
from typing import Any, Final

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

from producers.ledger import mcp_tool as ledger_tool
from producers.task_card.client import HostUnavailable, call_via_host
from producers.task_card.envelope import envelope_json_schema
from producers.task_card.runtime import HostPaths

TOOL_NAME: Final = "task_card"
FAILED_STATES: Final = frozenset({"failed", "stop_failed", "remove_blocked", "remove_failed"})
TOOL_DESCRIPTION: Final = (
    "Keep one truthful, self-refreshing progress card for the people following your work. "
    "Actions: start, inspect, retry, stop, remove, settings, manual. "
    "Call action=manual with input={} for the full contract."
)


def build_server(paths: HostPaths) -> Server[Any]:
    """The low-level server with the tool bound to one workdir's host."""
    tool = types.Tool(
        name=TOOL_NAME, description=TOOL_DESCRIPTION, input_schema=envelope_json_schema()
    )
    ledger = types.Tool(
        name=ledger_tool.TOOL_NAME,
        description=ledger_tool.TOOL_DESCRIPTION,
        input_schema=ledger_tool.input_schema(),
    )

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool, ledger])

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        result: dict[str, Any]
        if params.name == ledger_tool.TOOL_NAME:
            result = await anyio.to_thread.run_sync(
                ledger_tool.call_ledger, paths, params.arguments or {}
            )
        elif params.name != TOOL_NAME:
            result = {
                "status": "failed",
                "message": f"unknown tool {params.name!r}; this server has {TOOL_NAME}",
            }
        else:
            envelope = params.arguments or {}
            try:
                result = await anyio.to_thread.run_sync(call_via_host, paths, envelope)
            except (HostUnavailable, OSError, ValueError) as exc:
                result = {"status": "failed", "message": f"task card host unavailable: {exc}"}
        return types.CallToolResult(
            content=[types.TextContent(text=json.dumps(result, ensure_ascii=False))],
            structured_content=result,
            is_error=result.get("status") in FAILED_STATES,
        )

    return Server("taskcard", on_list_tools=list_tools, on_call_tool=call_tool)


async def serve_stdio(paths: HostPaths) -> None:
    server = build_server(paths)
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
