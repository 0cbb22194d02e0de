"""API keys: 256 random bits, stored only as SHA-256, revocable, checked in constant time."""

from __future__ import annotations

import hashlib
import inspect
import subprocess
import sys

import asyncpg
import pytest

from app.db.engine import Sessions
from app.errors import InvalidInput, NotFound
from app.services import keys


async def test_a_created_key_authenticates_its_tenant_only_until_revoked(
    sessions: Sessions,
) -> None:
    created = await keys.create_key(sessions, "acme", "ci runner")
    assert created.key.startswith("shv_")
    assert len(created.key) == len("shv_") + 16 + 1 + 43  # 43 url-safe chars: 256 bits
    assert keys.parse_key(created.key) == created.id
    assert await keys.authenticate(sessions, created.key) == "acme"
    [info] = await keys.list_keys(sessions, "acme")
    assert (info.id, info.tenant, info.name, info.revoked_at) == (
        created.id,
        "acme",
        "ci runner",
        None,
    )
    revoked = await keys.revoke_key(sessions, created.id)
    assert revoked.revoked_at is not None
    assert await keys.authenticate(sessions, created.key) is None
    again = await keys.revoke_key(sessions, created.id)  # harmless
    assert again.revoked_at == revoked.revoked_at


async def test_only_the_hash_is_stored(clean_db: str, sessions: Sessions) -> None:
    created = await keys.create_key(sessions, "acme")
    conn = await asyncpg.connect(clean_db.replace("+asyncpg", ""))
    try:
        rows = await conn.fetch("SELECT * FROM api_keys")
    finally:
        await conn.close()
    dump = repr([dict(row) for row in rows])
    secret = created.key.split("_", 2)[2]  # shv_<id>_<secret>; the secret may contain "_"
    assert secret not in dump
    assert created.key not in dump
    assert rows[0]["key_sha256"] == hashlib.sha256(created.key.encode()).hexdigest()


@pytest.mark.parametrize(
    "presented",
    [
        "",
        "x",
        "shv_",
        "shv_0123456789abcdef_" + "A" * 42,
        "shv_0123456789ABCDEF_" + "A" * 43,  # uppercase id: not ours
        "shv_0123456789abcdef_" + "A" * 43,  # well formed, unknown id
        "shv_0123456789abcdef_" + "A" * 43 + "\x00",
    ],
)
async def test_garbage_and_unknown_keys_do_not_authenticate(
    sessions: Sessions, presented: str
) -> None:
    assert await keys.authenticate(sessions, presented) is None


async def test_a_key_with_a_right_id_and_a_wrong_secret_is_refused(sessions: Sessions) -> None:
    created = await keys.create_key(sessions, "acme")
    forged = created.key[: -len("A")] + ("A" if not created.key.endswith("A") else "B")
    assert keys.parse_key(forged) == created.id
    assert await keys.authenticate(sessions, forged) is None


def test_comparisons_are_constant_time() -> None:
    """Hashes are compared with hmac.compare_digest, never `==` (code review as a test)."""
    for function in (keys.authenticate, keys.is_admin_key):
        source = inspect.getsource(function)
        assert "hmac.compare_digest" in source
        assert "==" not in source.replace("compare_digest", "")
    assert keys.is_admin_key("admin-key", "admin-key")
    assert not keys.is_admin_key("admin-key", "admin-kex")
    assert not keys.is_admin_key("", None)
    assert not keys.is_admin_key("anything", "")


@pytest.mark.parametrize("tenant", ["", "Acme", "a b", "../x", "a" * 65, "é", "-x"])
async def test_tenant_names_are_plain(sessions: Sessions, tenant: str) -> None:
    with pytest.raises(InvalidInput):
        await keys.create_key(sessions, tenant)


async def test_revoking_an_unknown_key_is_not_found(sessions: Sessions) -> None:
    for key_id in ("key_0000000000000000", "nope", "key_'; drop table api_keys; --"):
        with pytest.raises(NotFound):
            await keys.revoke_key(sessions, key_id)


def test_the_cli_creates_lists_and_revokes(clean_db: str) -> None:
    env = {"SANDHIVE_DATABASE_URL": clean_db, "PATH": "/usr/bin:/bin"}

    def sandhive(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "app", "keys", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    created = sandhive("create", "--tenant", "acme", "--name", "laptop")
    assert created.returncode == 0, created.stderr
    key = created.stdout.strip()
    assert keys.parse_key(key) is not None  # the key alone on stdout, for scripts
    listed = sandhive("list")
    assert key not in listed.stdout
    key_id, tenant, *_rest, name = listed.stdout.strip().split("\t")
    assert (key_id, tenant, name) == (keys.parse_key(key), "acme", "laptop")
    assert "active" in listed.stdout
    assert sandhive("revoke", key_id).returncode == 0
    assert "revoked" in sandhive("list", "--tenant", "acme").stdout
    assert sandhive("revoke", "key_0000000000000000").returncode == 1
    assert sandhive("create", "--tenant", "Not Valid").returncode == 2
