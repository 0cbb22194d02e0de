"""deploy/setup-host.sh leaves a checkout where the docs' first commands work as written."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "setup-host.sh"


def test_the_key_hint_names_a_tenant_where_user_is_unset() -> None:
    text = SCRIPT.read_text()
    hint = text[text.index("# API keys are on by default") :]
    shown = subprocess.run(
        ["bash", "-euc", hint], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    account = pwd.getpwuid(os.getuid()).pw_name
    assert f"keys create --tenant {account}\n" in shown.stdout, shown.stdout


def test_the_python_client_is_installed_beside_the_server() -> None:
    # CI runs deploy/setup-host.sh before the tests: the venv it made imports the client.
    found = subprocess.run(
        [sys.executable, "-c", "import sandhive_client, sys; print(sandhive_client.__file__)"],
        capture_output=True,
        text=True,
    )
    assert found.returncode == 0, f"{found.stderr}\nrun deploy/setup-host.sh (or make install)"
    assert Path(found.stdout.strip()).is_relative_to(ROOT / "clients" / "python")
    assert "-e clients/python" in SCRIPT.read_text()
