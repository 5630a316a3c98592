"""What a Telegram-only service loads: no module it never uses (each costs resident memory
for the whole life of the process, at every fleet size).

Each check runs in a fresh interpreter, so what this test process imported does not count.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _modules_after(code: str) -> set[str]:
    """The module names loaded after running `code` in a fresh interpreter."""
    script = textwrap.dedent(code) + "\nimport sys\nprint('\\n'.join(sys.modules))\n"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return set(done.stdout.split())


def test_serve_keeps_httpx_cli_out_and_httpx_still_works() -> None:
    loaded = _modules_after(
        """
        from taskcard.bridge.run.runner import skip_cli_only_imports
        skip_cli_only_imports()
        import sys
        import telegram, httpx
        assert callable(httpx.main) and httpx.AsyncClient is not None
        assert sys.modules["httpx._main"] is None  # the command was never loaded
        """
    )
    assert "telegram" in loaded and "httpx" in loaded
    assert not {"click", "pygments", "rich"} & loaded


def test_the_skip_leaves_an_already_imported_httpx_alone() -> None:
    loaded = _modules_after(
        """
        import httpx
        from taskcard.bridge.run.runner import skip_cli_only_imports
        skip_cli_only_imports()
        import sys
        # No `None` entry was added: a later `import httpx._main` would still work.
        assert sys.modules.get("httpx._main", "absent") is not None
        """
    )
    assert "httpx" in loaded


def test_the_watcher_loads_watchfiles_only_when_it_falls_back() -> None:
    loaded = _modules_after(
        """
        import taskcard.bridge.watch.watcher
        import taskcard.bridge.run.service
        """
    )
    assert "taskcard.bridge.watch.watcher" in loaded
    assert "watchfiles" not in loaded


def test_a_telegram_only_config_loads_no_feishu_sdk() -> None:
    loaded = _modules_after(
        """
        import taskcard.bridge.run.runner
        import taskcard.channels.telegram.channel
        """
    )
    assert not any(name == "lark_oapi" or name.startswith("lark_oapi.") for name in loaded)


def test_the_telegram_client_library_loads_without_the_passport_cryptography() -> None:
    loaded = _modules_after(
        """
        from taskcard.channels.telegram import import_client_library
        import_client_library()
        import taskcard.channels.telegram.channel
        import sys
        from telegram._bot import CRYPTO_INSTALLED
        assert not CRYPTO_INSTALLED  # PTB took it as not installed
        assert "cryptography" not in sys.modules  # and nothing is left in its place
        """
    )
    assert "telegram" in loaded
    assert not any(name.split(".")[0] == "cryptography" for name in loaded)


def test_cryptography_stays_importable_after_the_client_library() -> None:
    loaded = _modules_after(
        """
        from taskcard.channels.telegram import import_client_library
        import_client_library()
        import_client_library()  # once loaded, nothing more happens
        from cryptography.hazmat.primitives.hashes import SHA256
        assert SHA256.name == "sha256"
        """
    )
    assert "telegram" in loaded and "cryptography" in loaded


def test_an_earlier_import_of_cryptography_is_left_alone() -> None:
    loaded = _modules_after(
        """
        import cryptography
        from taskcard.channels.telegram import import_client_library
        import_client_library()
        from telegram._bot import CRYPTO_INSTALLED
        assert CRYPTO_INSTALLED  # it was there first: PTB uses it as usual
        """
    )
    assert "telegram" in loaded
