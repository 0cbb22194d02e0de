"""Proof, for a worker that cannot install the host rules of egress by domain name itself,
that someone did since the host last booted: a marker file in the proxy's directory.

`sandhive admin egress-firewall` (compose's one-shot, on the host's network) removes the
marker, installs the rules and writes it again: the host's boot id, the upstream bridge the
rules name, and the host's own addresses (a worker in a container sees only its own). A
worker with `manage_firewall` off refuses proxied sandboxes unless the marker is of this
boot and names its bridge, and refuses the addresses it lists in every grant. A reboot
changes the boot id (and empties /run); a failed run leaves no marker: both fail closed.
Imported by `app.sandbox.egress_proxy`.
"""

from __future__ import annotations

import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from app.errors import SandboxError

MARKER = "host-rules.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""The kernel's, not a namespace's: the same in every container of the host."""
HOW = "run `sandhive admin egress-firewall` on the Docker host (compose: `docker compose up -d`)"


def boot_id() -> str:
    return BOOT_ID.read_text().strip()


def marker_path(control_dir: Path) -> Path:
    return control_dir / MARKER


def remove_marker(control_dir: Path) -> None:
    """Before the rules are (re)installed: a run that fails leaves no marker behind."""
    with contextlib.suppress(FileNotFoundError):
        marker_path(control_dir).unlink()


def write_marker(control_dir: Path, bridge: str, addresses: list[str]) -> None:
    """Say the rules are in place for `bridge` on this boot (atomically: write, rename)."""
    control_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    body = {
        "boot_id": boot_id(),
        "bridge": bridge,
        "addresses": sorted(addresses),
        "written_at": datetime.now(UTC).isoformat(),
    }
    path = marker_path(control_dir)
    partial = path.with_name(f".{MARKER}.{os.getpid()}")
    partial.write_text(json.dumps(body, indent=2) + "\n")
    partial.chmod(0o644)
    partial.replace(path)


def confirmed(control_dir: Path, bridge: str) -> list[str]:
    """The host's addresses from a marker of this boot naming `bridge`; SandboxError (the
    sandbox is not started) saying what is wrong and what to run otherwise."""
    path = marker_path(control_dir)
    try:
        body = json.loads(path.read_text())
        written, named, addresses = body["boot_id"], body["bridge"], body["addresses"]
    except FileNotFoundError:
        problem = f"no {path} (nothing has installed them since the host booted)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        problem = f"{path} is unreadable ({exc!r})"
    else:
        if written != boot_id():
            problem = f"{path} is from before the host's last boot"
        elif named != bridge:
            problem = (
                f"{path} names upstream bridge {named}, not {bridge} (the network was made anew)"
            )
        else:
            return [str(address) for address in addresses]
    raise SandboxError(
        "egress by domain name is shut: the Docker host's egress rules are not confirmed: "
        f"{problem}; {HOW}",
        {"marker": str(path)},
    )
