"""`taskcard mcp`: a stdio MCP server over a small registry of tools (task_card, ledger, report,
reports, spawn, inbox).

Each tool is one `McpTool` entry in `TOOLS`: its name, description, input and output schemas,
annotations and a plain function from (workdir paths, arguments) to a result dict, run in a
worker thread. Adding a tool is adding one entry; the server code does not change.

The server owns no watch: `task_card` calls go to the workdir's background host (started on
demand), so a watch keeps refreshing after the MCP client disconnects; `manual` and
`settings`, which only read files, are answered without one (`client.call_via_host`). Input
schemas stay in the subset every major host loads (see `envelope_json_schema`); the strict
validation happens in the host, whose errors name the field and the fix.

Every result also carries what the agent should hear about its card, in
`_meta.agent_meta.taskcard`: the card as published, sent only when it changed since this
server last sent it, plus the task card wakes (error, recovered, limit, reminder) this server
has not delivered yet (`wakes.py`, consumer `mcp`).

A tools/call whose JSON names one key twice is refused, naming the key, before any tool
runs: the SDK would keep only the last value (`mcp_wire.py` reads each line first).

The server writes its own stdout (`mcp_answers.py`): an answer that hands something over
(the `inbox` tool's claimed messages) is settled once the client has read it, or put back
when it could not be. When stdin ends, the calls still running finish and write their own
answers before the server stops (`InFlight`); the SDK cancelled them and answered each one
"Connection closed", a report already written among them.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Final

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from taskcard.producers.inbox import mcp_tool as inbox_tool
from taskcard.producers.ledger import mcp_tool as ledger_tool
from taskcard.producers.reports import mcp_tool as reports_tool
from taskcard.producers.task_card.client import (
    HostElsewhere,
    HostUnavailable,
    call_failed,
    call_via_host,
)
from taskcard.producers.task_card.contract import (
    CardPaths,
    link_loop,
    quoted,
    shown_field,
    shown_path,
    utf8_encodable,
)
from taskcard.producers.task_card.envelope import ACTIONS, envelope_json_schema
from taskcard.producers.task_card.mcp_answers import (
    AnswerWriter,
    Deliveries,
    claimed_stdout,
    settled_on_signals,
)
from taskcard.producers.task_card.mcp_wire import (
    BadIds,
    CheckedLines,
    LongLines,
    RepeatedKeys,
    claimed_stdin,
)
from taskcard.producers.task_card.meta import MetaProjector
from taskcard.producers.task_card.number_args import whole_numbers
from taskcard.producers.task_card.runtime import CardFolderUnsafe, HostPaths, RuntimeDirUnsafe
from taskcard.producers.task_card.tool_failure import (
    BAD_ARGUMENTS,
    HOST_UNAVAILABLE,
    TASK_CARD_ONLY,
    TOOL_CODES,
    UNKNOWN_TOOL,
    UNUSABLE_FILE,
    WORKDIR_GONE,
    WORKDIR_HELD,
    failed,
)
from taskcard.producers.task_card.wakes import WakeReader

SERVER_NAME: Final = "taskcard"
WAKE_CONSUMER: Final = "mcp"
TOOL_NAME: Final = "task_card"
TOOL_DESCRIPTION: Final = (
    "Keep one truthful, self-refreshing progress card for the people following your work. "
    "Actions: start, inspect, retry, stop, remove, settings, manual. "
    "A start cancelled during its first render creates nothing; one cancelled later stays "
    "(start again to get its watch_id). "
    "Call action=manual with input={} for the full contract."
)
INSTRUCTIONS: Final = (
    "The task_card tool keeps one progress card per agent, shown to the people following "
    "your work in their chats.\n"
    "Renderer contract: a Python file inside your working directory that prints the whole "
    "card as Markdown to stdout and exits 0 (a goal, the state, the next step; at most "
    "max-body-chars characters). start runs it now and then every interval_s seconds; "
    "a failing run keeps the last good card and tells you.\n"
    "Call remove when the work is done. Results may carry _meta.agent_meta.taskcard: the "
    "card as published and notices about it. Read the manual action for the full contract."
)

# A tool function sees only the arguments its input schema names: `call_tool` refuses any
# other name (`unknown_field`) before it runs, so the functions keep no copy of that check.
# The event is set when the client cancels the call; a function may stop early on it, and
# its result is then dropped (a cancelled request gets no answer).
ToolFunction = Callable[[HostPaths, dict[str, Any], threading.Event], dict[str, Any]]
RecordingFunction = Callable[[HostPaths, dict[str, Any]], dict[str, Any]]
# For a tool whose answer hands something over (the `inbox` tool's claimed messages): called
# with the arguments and result once it is known whether the client read the answer.
SettleFunction = Callable[[HostPaths, dict[str, Any], dict[str, Any], bool], None]


@dataclass(frozen=True)
class McpTool:
    """One registry entry: everything the server needs to list and call a tool."""

    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    annotations: types.ToolAnnotations
    call: ToolFunction
    is_error: Callable[[dict[str, Any]], bool]
    settle: SettleFunction | None = None
    # True: the call reads its integer fields with the same `whole_numbers` itself (task_card:
    # `parse_envelope`, as for `taskcard tool` and the Python API), so the server leaves them
    # to it and a refusal reads the same on every way in.
    reads_own_numbers: bool = False
    # True: the tool's failures carry codes of its own besides the shared ones (`task_card`:
    # its watch's, which the manual lists); else only the shared codes (`TOOL_CODES`).
    own_codes: bool = False

    def listing(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema,
            output_schema=with_failure_code(self.output_schema, own_codes=self.own_codes),
            annotations=self.annotations,
        )


# The refusals this server makes itself, before any tool runs (`call_tool`), carry the codes
# every tool's failures share (`tool_failure`). Arguments the wire or the tool's schema
# refuse (a key given twice, a field the tool does not name, a fraction where a whole number
# belongs, bytes that are not UTF-8, nesting too deep) are the `bad_envelope` a `task_card`
# envelope refused by the host's schema gets: the same kind of error, whichever way it was
# caught.


def with_failure_code(schema: dict[str, Any], *, own_codes: bool = False) -> dict[str, Any]:
    """A tool's output schema naming `code`, which every failed result carries: one of the
    shared codes (an `enum` of them, `task_card`'s own aside), each said in its description."""
    shared = [code for code in TOOL_CODES if own_codes or code not in TASK_CARD_ONLY]
    said = "; ".join(f"{code}: {TOOL_CODES[code]}" for code in shared)
    code: dict[str, Any] = {"type": "string", "description": f"What kind of failure: {said}"}
    if own_codes:
        code["description"] += "; or one of the tool's own (see its manual)"
    else:
        code["enum"] = shared
    properties = schema.get("properties", {})
    return {**schema, "properties": {**properties, "code": code}}


def refusal(code: str, message: str) -> dict[str, Any]:
    """The result of a call this server refuses itself: the shape of every failed result."""
    return failed(code, message)


def task_card_output_schema() -> dict[str, Any]:
    """The structured result of `task_card`: the fields every result has, the rest open."""
    return {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(ACTIONS)},
            "status": {
                "type": "string",
                "description": "watching, error, stopped, exhausted, removed, ok, failed, ...",
            },
            "message": {"type": "string", "description": "Why a call failed, and the fix."},
            "summary": {"type": "string", "description": "One line, when summarize is true."},
            "final_retry_available": {
                "type": "boolean",
                "description": "true: the watch is exhausted and one retry may still publish"
                " a final state",
            },
        },
        "required": ["status"],
    }


def _call_task_card(
    paths: HostPaths, arguments: dict[str, Any], cancelled: threading.Event
) -> dict[str, Any]:
    try:
        return call_via_host(paths, arguments, cancel=cancelled)
    except CardFolderUnsafe as exc:  # `taskcard/` or `.taskcard-host/` leads out: no host
        return failed(UNUSABLE_FILE, f"task card host unavailable: {exc}")
    except HostElsewhere as exc:  # the command line's exit 3: its holder and the fix
        return failed(WORKDIR_HELD, str(exc))
    except (HostUnavailable, RuntimeDirUnsafe, OSError, ValueError) as exc:
        return failed(HOST_UNAVAILABLE, f"task card host unavailable: {exc}")


TASK_CARD_TOOL: Final = McpTool(
    name=TOOL_NAME,
    description=TOOL_DESCRIPTION,
    input_schema=envelope_json_schema(),
    output_schema=task_card_output_schema(),
    annotations=types.ToolAnnotations(
        title="Task card",
        read_only_hint=False,
        destructive_hint=True,  # remove deletes the published body
        idempotent_hint=False,
        open_world_hint=False,
    ),
    call=_call_task_card,
    is_error=call_failed,
    reads_own_numbers=True,
    own_codes=True,
)


def _recording_tool(
    name: str,
    description: str,
    input_schema: dict[str, Any],
    output_schema: dict[str, Any],
    title: str,
    call: RecordingFunction,
    settle: SettleFunction | None = None,
) -> McpTool:
    """A tool that records something in the workdir (an observation, a report, a spawn, a
    claimed message): never read-only, never destructive (its files are only appended to),
    not idempotent, and failed exactly when its result says so."""
    return McpTool(
        name=name,
        description=description,
        input_schema=input_schema,
        output_schema=output_schema,
        annotations=types.ToolAnnotations(
            title=title,
            read_only_hint=False,
            destructive_hint=False,
            idempotent_hint=False,
            open_world_hint=False,
        ),
        # Quick writes of one file: a cancelled call runs to its end (the spec lets a server
        # finish what it started), and its result is dropped.
        call=lambda paths, arguments, cancelled: call(paths, arguments),
        is_error=lambda result: result.get("status") == "failed",
        settle=settle,
    )


LEDGER_TOOL: Final = _recording_tool(
    ledger_tool.TOOL_NAME,
    ledger_tool.TOOL_DESCRIPTION,
    ledger_tool.input_schema(),
    {
        "type": "object",
        "properties": {
            "status": {"type": "string", "description": "ok, or failed with a message"},
            "command": {"type": "string", "enum": list(ledger_tool.COMMANDS)},
            "message": {"type": "string", "description": "Why a call failed, and the fix."},
        },
        "required": ["status"],
    },
    "Long-task ledger",
    ledger_tool.call_ledger,
)
REPORT_TOOL: Final = _recording_tool(
    reports_tool.REPORT_TOOL,
    reports_tool.REPORT_DESCRIPTION,
    reports_tool.report_schema(),
    reports_tool.result_schema(),
    "Report",
    reports_tool.call_report,
)
READ_REPORTS_TOOL: Final = McpTool(
    name=reports_tool.READ_TOOL,
    description=reports_tool.READ_DESCRIPTION,
    input_schema=reports_tool.read_schema(),
    output_schema=reports_tool.read_result_schema(),
    annotations=types.ToolAnnotations(
        title="Read reports",
        read_only_hint=True,
        destructive_hint=False,
        idempotent_hint=True,
        open_world_hint=False,
    ),
    call=lambda paths, arguments, cancelled: reports_tool.call_reports(paths, arguments),
    is_error=lambda result: result.get("status") == "failed",
)
SPAWN_TOOL: Final = _recording_tool(
    reports_tool.SPAWN_TOOL,
    reports_tool.SPAWN_DESCRIPTION,
    reports_tool.spawn_schema(),
    reports_tool.result_schema(),
    "Record a spawned agent",
    reports_tool.call_spawn,
)
INBOX_TOOL: Final = _recording_tool(
    inbox_tool.TOOL_NAME,
    inbox_tool.TOOL_DESCRIPTION,
    inbox_tool.input_schema(),
    inbox_tool.output_schema(),
    "Messages from the chat",  # it claims what it returns
    inbox_tool.call_inbox,
    inbox_tool.settle_inbox,  # acknowledged once the client read the answer, else queued again
)

# The registry: one entry per tool this server offers.
TOOLS: Final[tuple[McpTool, ...]] = (
    TASK_CARD_TOOL,
    LEDGER_TOOL,
    REPORT_TOOL,
    READ_REPORTS_TOOL,
    SPAWN_TOOL,
    INBOX_TOOL,
)


def unknown_field(tool: McpTool, arguments: dict[str, Any]) -> str | None:
    """The message for the first argument the tool's schema does not name, else None.

    Checked here, once for every tool, before a tool function sees the arguments: a name a
    tool does not know used to reach Python as a keyword, where `self` clashed with the method
    it was passed to and `report` answered "ok: required" about a field that was given.
    """
    fields = tool.input_schema.get("properties", {})
    stray = sorted(name for name in arguments if name not in fields)
    if not stray:
        return None
    fix = f"remove it (its fields: {', '.join(fields)})"
    return f"{shown_field(stray[0])}: not a field of {tool.name}; {fix}"


def workdir_gone(paths: HostPaths) -> str:
    """Why the workdir cannot be used any more: removed, or (named in the words of every
    reader, `contract.link_loop`) made a link round a loop of symbolic links."""
    loop = link_loop(paths.workdir)
    if loop is not None:
        return (
            f"workdir: {shown_path(paths.workdir)} {loop} (it became one while this server"
            " ran); nothing was written; fix the links, or restart the server with an"
            " existing --workdir"
        )
    return (
        f"workdir: {paths.workdir} no longer exists (it was removed while this server ran);"
        " nothing was written and it is not created again; restart the server with an"
        " existing --workdir"
    )


def given(arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments without those given as null: a null counts as left out, for every tool
    alike (clients send null for an optional field they leave empty). Some tools took it so
    and others refused it: `spawn` refused a null `parent` it has a default for, `inbox` a
    null `peek`, `task_card` a null `summarize`, while `report` and `ledger` left them out.
    A required field given as null is then refused as missing, naming it."""
    return {name: value for name, value in arguments.items() if value is not None}


def package_version() -> str:
    try:
        return metadata.version("taskcard")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class AgentMeta:
    """What this server still has to tell the agent about its card (change-gated, once)."""

    def __init__(self, paths: HostPaths) -> None:
        card_paths = CardPaths(paths.workdir)
        self._projector = MetaProjector(card_paths)
        self._wakes = WakeReader(card_paths, WAKE_CONSUMER)

    def prime(self) -> None:
        """A first server for the workdir starts at the end: older notices are not news."""
        self._wakes.prime()

    def take(self) -> dict[str, Any] | None:
        """The `_meta` of the next result, or None when there is nothing new."""
        projection = self._projector.poll()
        wakes = self._wakes.take()
        if projection is None and not wakes:
            return None
        payload = dict(projection if projection is not None else self._projector.current())
        if wakes:
            payload["notices"] = wakes
        return {"agent_meta": {"taskcard": payload}}


async def run_settled(
    tool: McpTool,
    paths: HostPaths,
    arguments: dict[str, Any],
    ctx: ServerRequestContext[Any],
    deliveries: Deliveries | None,
) -> dict[str, Any]:
    """`tool.call`, and for a tool with a settle function, its answer handed to `deliveries`
    to settle once written (or at once, as delivered, without them). A call cancelled while
    its thread ran gets no answer: what it handed over is settled as not delivered."""
    settle = tool.settle
    if settle is None:
        return await run_cancellable(tool.call, paths, arguments)
    kept: list[dict[str, Any]] = []

    def call(paths: HostPaths, arguments: dict[str, Any], cancelled: threading.Event) -> Any:
        kept.append(tool.call(paths, arguments, cancelled))
        return kept[-1]

    try:
        result = await run_cancellable(call, paths, arguments)
    except BaseException:
        if kept:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(settle, paths, arguments, kept[0], False)
        raise
    if deliveries is None:
        settle(paths, arguments, result, True)
    else:
        deliveries.expect(
            ctx.request_id, lambda delivered: settle(paths, arguments, result, delivered)
        )
    return result


async def run_cancellable(
    call: ToolFunction, paths: HostPaths, arguments: dict[str, Any]
) -> dict[str, Any]:
    """`call` in a worker thread, told through its event when this request is cancelled (the
    client's `notifications/cancelled`, or the server stopping). A thread cannot be stopped
    from outside, so the call runs to its end either way; the flag lets it stop before it
    commits (a `start` in its first render)."""
    cancelled = threading.Event()

    async def flag_when_cancelled() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(flag_when_cancelled)
        try:
            result = await anyio.to_thread.run_sync(call, paths, arguments, cancelled)
        finally:
            tasks.cancel_scope.cancel()
    return result


def build_server(
    paths: HostPaths,
    tools: tuple[McpTool, ...] = TOOLS,
    repeated: RepeatedKeys | None = None,
    deliveries: Deliveries | None = None,
) -> Server[Any]:
    """The low-level server with every registry tool bound to one workdir; `repeated`: the
    check that read its stdin lines, whose refusals its tool calls answer; `deliveries`: the
    answers its writer settles (None: a tool's answer counts as delivered once returned)."""
    repeated = repeated if repeated is not None else RepeatedKeys()
    by_name = {tool.name: tool for tool in tools}
    listing = [tool.listing() for tool in tools]
    agent_meta = AgentMeta(paths)
    with contextlib.suppress(OSError):  # `.notification/` unusable: no wakes, tools still work
        agent_meta.prime()

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listing)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = by_name.get(params.name)
        gone = not await anyio.to_thread.run_sync(paths.workdir.is_dir)
        if tool is None:
            known = ", ".join(by_name)
            message = f"unknown tool {quoted(params.name)}; call one this server has: {known}"
            result: dict[str, Any] = refusal(UNKNOWN_TOOL, message)
            failed = True
        elif gone:
            # Every tool writes into the workdir, and each write made its folders again: a
            # workdir deleted (the agent's work cleared away) came back as an empty agent.
            result, failed = refusal(WORKDIR_GONE, workdir_gone(paths)), True
        else:
            arguments = dict(params.arguments or {})
            refused = repeated.refusal(arguments)
            stray = refused if refused is not None else unknown_field(tool, arguments)
            if stray is None and not tool.reads_own_numbers:
                arguments, stray = whole_numbers(tool.input_schema, arguments)
            if stray is not None:
                result, failed = refusal(BAD_ARGUMENTS, stray), True
            else:
                result = await run_settled(tool, paths, given(arguments), ctx, deliveries)
                failed = tool.is_error(result)
        try:
            meta = None if gone else await anyio.to_thread.run_sync(agent_meta.take)
        except OSError:
            meta = None  # the card's news waits for the next call; the result must not
        # Paths of a workdir whose name is not UTF-8 carry surrogate escapes, which the SDK
        # cannot write: the server ended on them.
        result = utf8_encodable(result)
        return types.CallToolResult(
            _meta=utf8_encodable(meta),
            content=[types.TextContent(text=json.dumps(result, ensure_ascii=False))],
            structured_content=result,
            is_error=failed,
        )

    server: Server[Any] = Server(
        SERVER_NAME,
        version=package_version(),
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.middleware.append(name_invalid_params)
    return server


# How a tools/call request is shaped, for a refusal of one that is not.
_CALL_SHAPE: Final = (
    "a tools/call gives the tool's name (text) and its fields as one object (arguments)"
)


def invalid_params_message(method: str, error: ValidationError) -> str:
    """What is wrong with a request's params, naming the first field the SDK refused."""
    first = error.errors()[0] if error.errors() else None
    where = ".".join(str(part) for part in first["loc"]) if first else ""
    what = f"{where}: {first['msg']}" if first and where else "not an object"
    shape = f"; {_CALL_SHAPE}" if method == "tools/call" else ""
    return f"Invalid params: {what}{shape}"


# The SDK's words for a request before `initialize`, the only error it answers so bare.
_SDK_BARE_REFUSAL: Final = "Invalid request parameters"


def not_initialized_message(method: str) -> str:
    return (
        f"Invalid params: {method} before initialize; the session is not initialized: send"
        " initialize first, and after its answer notifications/initialized, then this request"
        " (only ping is answered before)"
    )


async def name_invalid_params(ctx: ServerRequestContext[Any], call_next: Any) -> Any:
    """The SDK's answer to params its models refuse, with the field named: a tools/call
    whose `arguments` was an array, or without a `name`, was answered "Invalid request
    parameters" and nothing else. So was a tools/list or tools/call before `initialize`: the
    MCP spec gives no code for it, so the SDK's -32602 stays and its message says what to
    send first."""
    try:
        return await call_next(ctx)
    except ValidationError as exc:
        if ctx.request_id is None:
            raise  # a notification gets no answer
        raise MCPError(
            code=types.INVALID_PARAMS, message=invalid_params_message(ctx.method, exc), data=""
        ) from None
    except MCPError as exc:
        bare = exc.error.code == types.INVALID_PARAMS and exc.error.message == _SDK_BARE_REFUSAL
        if not bare or ctx.session.client_params is not None:
            raise
        raise MCPError(
            code=types.INVALID_PARAMS, message=not_initialized_message(ctx.method), data=""
        ) from None


async def serve_stdio(paths: HostPaths) -> None:
    repeated = RepeatedKeys()
    long = LongLines()
    with claimed_stdin() as wire, claimed_stdout() as out:
        # Our own reader of stdin, so each line is checked while its text still shows a
        # repeated key (`mcp_wire`); our own writer of stdout, so an answer that hands
        # something over is settled once the client read it (`mcp_answers`).
        deliveries = Deliveries() if out is not None else None
        server = build_server(paths, repeated=repeated, deliveries=deliveries)
        lines = anyio.wrap_file(CheckedLines(wire, repeated.line, long))
        answers = (
            anyio.wrap_file(AnswerWriter(out, deliveries))  # type: ignore[arg-type]
            if out is not None and deliveries is not None
            else None
        )
        try:
            with settled_on_signals(deliveries):
                async with stdio_server(stdin=lines, stdout=answers) as (
                    read_stream,
                    write_stream,
                ):
                    in_flight = InFlight()
                    answering = AnswerMalformed(
                        read_stream, write_stream, long, repeated.ids, in_flight
                    )
                    await server.run(
                        answering,
                        Answers(write_stream, in_flight),
                        server.create_initialization_options(),
                    )
        finally:
            if deliveries is not None:  # answers never written: what they held goes back
                deliveries.settle_all(delivered=False)


# Python's `int` refuses to read a decimal number longer than this (`sys.int_info`).
_INT_DIGITS: Final = 4300


class _TooLong(ValueError):
    """A number in the line that no JSON reader of this process can hold."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _INT_DIGITS:
        raise _TooLong(text)
    return int(text)


_UNREADABLE: Final = object()  # a number too long for `int`: never taken for an id


def _int_or_unreadable(text: str) -> object:
    """A number as `int`, or a marker when too long for one: enough to find the request's id
    (an id that is such a number cannot be echoed, and is answered as null)."""
    try:
        return _bounded_int(text)
    except _TooLong:
        return _UNREADABLE


# How to send a text that holds half of a surrogate pair (the SDK's reader refuses it).
_SURROGATES: Final = "; a text may not hold half a surrogate pair: send both halves, or drop it"


def malformed_answer(line: object, problem: str = "") -> types.JSONRPCError | None:
    """The JSON-RPC error answering a line the SDK could not read as a message (`line`:
    the text, or the object it decoded to; `problem`: what was wrong with that object, or
    why the SDK's reader refused the text as JSON), or
    None for a well-formed notification, which gets no answer even when a number is too long.

    Not JSON: a parse error (-32700). JSON whose numbers are too long for Python's `int`
    (the SDK's reader refuses the whole line): invalid params (-32602), for the request's id.
    JSON that is not one JSON-RPC message (an array, a `method` that is not text): an invalid
    request (-32600). The id is echoed when it can be read, null otherwise, as JSON-RPC asks."""
    decoded: object = line
    if isinstance(line, str | bytes):
        try:
            decoded = json.loads(line, parse_int=_bounded_int)
        except _TooLong:
            decoded = json.loads(line, parse_int=_int_or_unreadable)
            if isinstance(decoded, dict) and "id" not in decoded:
                return None  # a notification: never answered
            return _error(
                decoded,
                types.INVALID_PARAMS,
                f"Invalid params: a number has more than {_INT_DIGITS} digits; send it as text",
            )
        except (ValueError, RecursionError) as exc:
            reason = "nested too deep" if isinstance(exc, RecursionError) else str(exc)[:120]
            return _error(None, types.PARSE_ERROR, f"Parse error: not one JSON document ({reason})")
        if problem:
            # JSON to Python, not to the SDK's stricter reader: an escaped half of a surrogate
            # pair (`"\ud800"`, a cut emoji) or a `NaN`. Its words name the place.
            hint = _SURROGATES if "escape" in problem else ""
            return _error(decoded, types.PARSE_ERROR, f"Parse error: {problem[:160]}{hint}")
    what = f"{problem}; a" if problem else "not a JSON-RPC 2.0 message: a"
    return _error(
        decoded,
        types.INVALID_REQUEST,
        f'Invalid Request: {what} request is one object with jsonrpc "2.0", an id,'
        " a method (text) and params (an object)",
    )


def _error(decoded: object, code: int, message: str) -> types.JSONRPCError:
    ident = decoded.get("id") if isinstance(decoded, dict) else None
    if not isinstance(ident, str | int) or isinstance(ident, bool):
        ident = None
    return types.JSONRPCError(
        jsonrpc="2.0", id=ident, error=types.ErrorData(code=code, message=message)
    )


# How long the end of stdin waits for the calls still running (see `InFlight`): far longer
# than any tool takes, short enough that a call stuck for good does not keep the server.
DRAIN_SECONDS: Final = 300.0


class InFlight:
    """The requests read and not yet answered, so the end of stdin can wait for them.

    When stdin ends, the SDK's server cancels every call still running and answers each
    -32000 "Connection closed", even one whose tool had already written (a `report`
    recorded, answered as failed). A client that writes its calls and then closes its end of
    the pipe still reads stdout. So the read stream ends only once every request read has
    been answered (or cancelled by the client, which is never answered), within
    `DRAIN_SECONDS`: each running call writes its real answer, then the server stops."""

    def __init__(self) -> None:
        self._ids: set[tuple[str, object]] = set()
        self._changed = anyio.Event()

    @staticmethod
    def _key(ident: object) -> tuple[str, object]:
        return (type(ident).__name__, ident)  # 1 and "1" are two requests

    def read(self, message: object) -> None:
        if isinstance(message, types.JSONRPCRequest):
            self._ids.add(self._key(message.id))
        elif (
            isinstance(message, types.JSONRPCNotification)
            and message.method == "notifications/cancelled"
            and isinstance(message.params, dict)
        ):
            self._done(message.params.get("requestId"))

    def answered(self, message: object) -> None:
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            self._done(message.id)

    def _done(self, ident: object) -> None:
        self._ids.discard(self._key(ident))
        self._changed.set()

    async def drained(self) -> None:
        """Returns once no request read is still unanswered, or after `DRAIN_SECONDS`."""
        with anyio.move_on_after(DRAIN_SECONDS):
            while self._ids:
                self._changed = anyio.Event()
                await self._changed.wait()


class Answers:
    """The SDK's write stream, telling `in_flight` of each answer it carries."""

    def __init__(self, inner: Any, in_flight: InFlight) -> None:
        self._inner = inner
        self._in_flight = in_flight

    async def send(self, item: SessionMessage) -> None:
        try:
            await self._inner.send(item)
        finally:  # written or not, it will not be answered again
            self._in_flight.answered(item.message)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Answers:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class AnswerMalformed:
    """The SDK's read stream, with each line it could not read answered instead of dropped.

    The SDK's stdio transport hands the server an exception for such a line, and the server
    drops it without a word: a client whose request went that way waited for ever. This
    wrapper answers it on the write stream (see `malformed_answer`) and goes on reading; the
    stand-in for a line over the limit (`long`) is answered with the limit, and that for a
    request whose id is not one (`ids`) with what is wrong with it. Its end comes once the
    calls still running have been answered (`in_flight`)."""

    def __init__(
        self,
        inner: Any,
        out: Any,
        long: LongLines | None = None,
        ids: BadIds | None = None,
        in_flight: InFlight | None = None,
    ) -> None:
        self._inner = inner
        self._out = out
        self._long = long or LongLines()
        self._ids = ids or BadIds()
        self._in_flight = in_flight

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        while True:
            try:
                item = await self._inner.receive()
            except anyio.EndOfStream:
                if self._in_flight is not None:
                    await self._in_flight.drained()
                raise
            if not isinstance(item, Exception):
                if self._in_flight is not None:
                    self._in_flight.read(item.message)
                return item
            answer = _answer_for(item, self._long, self._ids)
            if answer is not None:
                await self._out.send(SessionMessage(answer))

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> AnswerMalformed:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> AnswerMalformed:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _answer_for(
    error: Exception, long: LongLines, ids: BadIds | None = None
) -> types.JSONRPCError | None:
    """The answer to the line behind `error`. A validation error of the SDK's reader carries
    the line: as the input of a JSON error, else as the input of an error about the whole
    object (a field missing from it, or not an object at all); its first complaint about
    the request's own fields says what is wrong. The stand-in for a line over the limit is
    such an object (`long`), as is that for a request whose id is not one (`ids`)."""
    if not isinstance(error, ValidationError):
        return None  # not about a line: nothing to answer
    details = error.errors()
    whole = [
        d["input"]
        for d in details
        if len(d["loc"]) <= 1 or (d["type"] == "missing" and len(d["loc"]) == 2)
    ]
    if not details:
        return malformed_answer(None)
    if whole and long.marks(whole[0]):
        return _error(whole[0], types.INVALID_REQUEST, long.message)
    bad_id = ids.marks(whole[0]) if whole and ids is not None else None
    if bad_id is not None:
        return _error(None, types.INVALID_REQUEST, bad_id)
    if details[0]["type"] == "json_invalid" or not whole:
        line = details[0].get("input")
        if isinstance(line, str) and not line.strip():
            return None  # a blank line between messages: nothing was asked
        refused = details[0]["type"] == "json_invalid"
        return malformed_answer(line, str(details[0]["msg"]) if refused else "")
    # What the object is wrong for: a request when it has an id, else a notification.
    kind = "JSONRPCRequest" if isinstance(whole[0], dict) and "id" in whole[0] else ""
    kind = kind or "JSONRPCNotification"
    problem = next(
        (
            f"{d['loc'][1]}: {d['msg']}"
            for d in details
            if len(d["loc"]) == 2 and d["loc"][0] == kind
        ),
        "",
    )
    return malformed_answer(whole[0], problem)
