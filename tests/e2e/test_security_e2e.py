"""Access control as users meet it, with real processes: `tether up` makes the local user's token
and keeps it in a 0600 config file; `tether token create/list/revoke`; secret environment values
that the program gets but `tether status` and `tether logs` never show; `tether audit`."""

from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

import pytest
import trio
from leaks import MARKER
from stack import TETHER, debug_run, home_env, relay_stack

from adapter.scripted_ide.dap_client import open_dap_client
from protocol_specs.dap import framing as dap_framing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SECRET = f"{MARKER}-0f9a"  # the leak scan after the test knows it
PRINTS_ITS_KEY = f"""\
import os
key = os.environ["API_KEY"]
print("the key is", key, flush=True)
print("got the real one:", key == "{SECRET}", flush=True)
"""


async def tether_cli(home: Path, *args: str, token: str = "", ok: bool = True) -> tuple[str, str]:
    """Run a tether command to its end: (stdout, stderr)."""
    env = home_env(home)
    if token:
        env["TETHER_TOKEN"] = token
    with trio.fail_after(90):
        done = await trio.run_process(
            [TETHER, *args], capture_stdout=True, capture_stderr=True, env=env, check=False
        )
    out, err = done.stdout.decode(), done.stderr.decode()
    from leaks import PROCESS_LINES

    PROCESS_LINES.extend(out.splitlines() + err.splitlines())  # scanned for secrets afterwards
    assert (done.returncode == 0) is ok, f"tether {' '.join(args)}: {done.returncode}\n{out}\n{err}"
    return out, err


async def test_tokens_secrets_and_the_audit_trail_through_the_cli(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "main.py").write_text(PRINTS_ITS_KEY)
    async with relay_stack(home, workers=1) as (up, _relay):
        await up.wait_line(r"a token for \S+ is in .*/data/token \(mode 0600\)")
        kept = home / "data" / "token"
        assert stat.S_IMODE(kept.stat().st_mode) == 0o600
        assert kept.read_text().startswith("tthu_")
        assert not (home / "config.toml").exists()  # the user's config: not written

        # a secret reaches the program, and nobody else
        out, err = await tether_cli(
            home,
            "run", "--follow", "--workdir", str(workdir), "--secret", f"API_KEY={SECRET}",
            "--env", "MODE=fast", "--", "python", "main.py",
        )  # fmt: skip
        assert "the key is <secret>\ngot the real one: True\n" in out
        queued = re.search(r"tether run: run (\S+) queued", err)  # progress: on stderr
        assert queued is not None, err
        run_id = queued.group(1)
        status, _ = await tether_cli(home, "status", run_id)
        assert "API_KEY=<secret>" in status and "MODE=fast" in status
        logs, _ = await tether_cli(home, "logs", run_id)
        assert "the key is <secret>" in logs

        # a second token, used, listed, revoked
        new, note = await tether_cli(home, "token", "create", "--label", "ci-bot")
        token = new.strip()
        assert token.startswith("tthu_") and "shown once" in note
        listed, _ = await tether_cli(home, "ls", token=token)
        assert run_id in listed
        tokens, _ = await tether_cli(home, "token", "list")
        assert "ci-bot" in tokens and token not in tokens
        token_id = token.split("_")[1]
        await tether_cli(home, "token", "revoke", token_id)
        _, refused = await tether_cli(home, "ls", token=token, ok=False)
        assert f"token {token_id} was revoked" in refused and token not in refused
        _, nobody = await tether_cli(
            home, "ls", token="tthu_0123456789abcdef_" + "x" * 43, ok=False
        )
        assert "the token is not valid" in nobody

        # who did what to the run
        trail, _ = await tether_cli(home, "audit", run_id)
        events = [line.split()[2] for line in trail.splitlines()]
        # `run --follow` reads the logs while the pool claims the run: those two in either order
        assert events[0] == "submit" and {"claim", "connect", "logs"} <= set(events), events
        assert token not in trail


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="connecting as another OS user (nobody) needs root, and the check needs Linux",
)
async def test_the_adapter_refuses_another_os_user(tmp_path: Path) -> None:
    home = tmp_path / "home"
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "main.py").write_text("print('hi')\n")
    async with (
        relay_stack(home) as (_up, relay),
        debug_run(home, relay, workdir, "python", "main.py") as (debug, _run, port),
    ):
        initialize = dap_framing.encode_message(
            {"seq": 1, "type": "request", "command": "initialize", "arguments": {"adapterID": "x"}}
        )
        # bash's /dev/tcp as user nobody: sends an initialize, prints whatever comes back
        script = f'exec 3<>/dev/tcp/127.0.0.1/{port}; printf %s "$REQ" >&3; timeout 20 cat <&3'
        with trio.fail_after(30):
            other = await trio.run_process(
                ["bash", "-c", script],
                env={"REQ": initialize.decode(), "PATH": "/usr/bin:/bin"},
                user=65534,
                group=65534,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        assert other.stdout == b"", other.stdout  # not a byte of DAP for another user
        await debug.wait_line(r"refused a connection: from uid 65534, another OS user")
        async with open_dap_client("127.0.0.1", port) as ide:  # its owner still gets in
            answer = await ide.request("initialize", {"adapterID": "x"})
            assert answer["success"]
