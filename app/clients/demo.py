"""`sandhive demo` through a running service: submit the demo task over HTTP and follow it.

Imported by `app.cli.main` only. When the service answers and offers the `scripted` profile,
the demo runs there (so it appears in the page); otherwise `find_service` says why not
and the demo runs locally, as `sandhive run` does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from app.config import SCRIPTED_PROFILE

POLL_S = 1.0
TERMINAL = {"succeeded", "failed", "cancelled"}


@dataclass(frozen=True)
class Service:
    url: str
    headers: dict[str, str]


def find_service(url: str, api_key: str | None) -> tuple[Service | None, str]:
    """The service at `url` if it serves the `scripted` profile to this key; else why not."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{url}/v1/llm/profiles", headers=headers, timeout=3.0)
    except httpx.HTTPError:
        return None, f"no service at {url}"
    if response.status_code == 401:
        return None, f"the service at {url} needs an API key (--api-key or SANDHIVE_API_KEY)"
    if response.status_code != 200:
        return None, f"the service at {url} answered {response.status_code}"
    names = {p.get("name") for p in response.json().get("profiles", [])}
    if SCRIPTED_PROFILE not in names:
        return None, f"the service at {url} has no scripted profile (SANDHIVE_SCRIPTED_PROFILE)"
    return Service(url, headers), ""


def submit(service: Service, prompt: str, model: str) -> str:
    """Submit the demo task; its id."""
    body = {"prompt": prompt, "llm": {"profile": SCRIPTED_PROFILE, "model": model}}
    response = httpx.post(f"{service.url}/v1/tasks", json=body, headers=service.headers)
    response.raise_for_status()
    return str(response.json()["id"])


def wait(service: Service, task_id: str, timeout_s: float = 600.0) -> dict[str, Any]:
    """Poll the task until it finishes; its last state."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = httpx.get(f"{service.url}/v1/tasks/{task_id}", headers=service.headers)
        response.raise_for_status()
        task: dict[str, Any] = response.json()
        if task.get("status") in TERMINAL or time.monotonic() > deadline:
            return task
        time.sleep(POLL_S)
