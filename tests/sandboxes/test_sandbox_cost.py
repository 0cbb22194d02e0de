"""What a sandbox's create and a command through the sandbox API cost the API in Postgres
round trips, counted apart from the pool's pings (docs/performance.md): the sandbox API
answers bursts, and each round trip is CPU in the API and in Postgres. Counts, not times:
these machines are noisy."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.sandboxes.conftest import ALICE, create, run
from tests.support.postgres_trips import PostgresTrips, counting_postgres_trips
from tests.support.zygote import AppProcess

CREATE_TRIPS = 6
"""The placement's read of each worker's load (no transaction around one statement), the
admitted insert (`BEGIN`, the tenant's lock, the count, the insert, `COMMIT`); 8 before the
read went without its transaction, 10 with the pool's pings (2026-12-05)."""
COMMAND_TRIPS = 3
"""The row's read, the log entry as sent (the count and the insert as one statement), its
outcome: one statement each; 10 before, 13 with the pool's pings (2026-12-05)."""
CHECKOUTS = {"create": 2, "command": 3}
"""Connections each takes from the pool: a ping at most for each, and none for one given
back within `SANDHIVE_DATABASE_PING_BYPASS_S`, as here, where requests follow one another."""


@pytest.fixture
def trips() -> Iterator[PostgresTrips]:
    """Declared before `api`, so the API's connections are opened while counting."""
    with counting_postgres_trips() as counted:
        yield counted


async def test_a_create_and_a_command_cost_the_api_a_few_round_trips(
    trips: PostgresTrips, api: httpx.AsyncClient, worker: AppProcess
) -> None:
    made = await create(api)  # the first: connections opened, statements prepared
    await run(api, made["id"], command="true")
    trips.taken()

    again = await create(api)
    created = trips.taken()
    done = await run(api, again["id"], command="echo hi")
    ran = trips.taken()

    assert done["stdout"] == "hi\n", done
    print("create:", *created, "command:", *ran, sep="\n  ")
    for name, sent, most in (("create", created, CREATE_TRIPS), ("command", ran, COMMAND_TRIPS)):
        pings = sent.count("SELECT 1")
        assert pings <= CHECKOUTS[name], (name, sent)
        assert len(sent) - pings <= most, (name, sent)
    assert any(sent.startswith("INSERT INTO sandboxes") for sent in created), created
    assert any("INSERT INTO sandbox_commands" in sent for sent in ran), ran
    log = await api.get(f"/v1/sandboxes/{again['id']}/commands", headers=ALICE)
    assert [
        (entry["seq"], entry["command"], entry["argv"], entry["exit_code"])
        for entry in log.json()["items"]
    ] == [(1, "echo hi", None, 0)], "the one statement stored the entry and its outcome"
