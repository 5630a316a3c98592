"""The console channel as a person at the terminal sees it: rich panels, a header, notices."""

from __future__ import annotations

import io

from taskcard.channels.base import CardView
from taskcard.channels.console.channel import CONSOLE_CHAT, ConsoleChannel, ConsoleHeader
from taskcard.channels.errors import NotModified

CLEAR = "\x1b[2J\x1b[H"  # what rich writes to clear the screen
HEADER = ConsoleHeader(agents=("builder", "migrator"), routes=("console: builder, migrator",))


def view(body: str, state: str = "running") -> CardView:
    return CardView(
        agent_id="builder",
        state=state,  # type: ignore[arg-type]
        auto_rows=("▶ running, turn since 15:00 UTC",),
        body=body,
    )


async def _nothing(command: object) -> None:
    del command


async def test_a_pipe_gets_the_header_once_and_each_change_once_without_colour() -> None:
    out = io.StringIO()
    console = ConsoleChannel(out, live=False, header=HEADER, width=60)
    await console.start(_nothing)
    message_id = await console.send(CONSOLE_CHAT, console.render_card(view("**compile** 1/3")))
    await console.edit(
        CONSOLE_CHAT, message_id, console.render_card(view("# Tests\n\n- `unit` green"))
    )
    await console.send(CONSOLE_CHAT, console.render_text("⚠️ builder: task card error"))
    text = out.getvalue()
    assert "\x1b[" not in text  # no escape codes in a pipe or a log file
    assert text.count("Ctrl-C to stop") == 1
    assert "2 agents: builder, migrator" in text and "console: builder, migrator" in text
    # Markdown is rendered, not shown as source.
    assert "compile 1/3" in text and "**compile**" not in text
    assert "• unit green" in text and "# Tests" not in text
    assert "builder · running" in text
    assert "! ⚠️ builder: task card error" in text


async def test_a_terminal_redraw_keeps_the_notices_and_colours_the_state() -> None:
    out = io.StringIO()
    console = ConsoleChannel(out, live=True, header=HEADER, width=60)
    await console.start(_nothing)
    message_id = await console.send(CONSOLE_CHAT, console.render_card(view("step 1")))
    await console.send(CONSOLE_CHAT, console.render_text("⏹ builder: refresh budget used up"))
    await console.edit(CONSOLE_CHAT, message_id, console.render_card(view("step 2")))
    screen = out.getvalue().rsplit(CLEAR, 1)[-1]  # what the terminal shows now
    assert "Ctrl-C to stop" in screen
    assert "step 2" in screen and "step 1" not in screen
    assert "refresh budget used up" in screen  # the notice survived the card's redraw
    assert "\x1b[32m" in screen  # running is green
    assert console.notices == ["⏹ builder: refresh budget used up"]


async def test_an_unchanged_card_is_not_modified() -> None:
    console = ConsoleChannel(io.StringIO(), live=False)
    message_id = await console.send(CONSOLE_CHAT, console.render_card(view("same")))
    try:
        await console.edit(CONSOLE_CHAT, message_id, console.render_card(view("same")))
    except NotModified:
        pass
    else:
        raise AssertionError("an identical edit must raise NotModified")
