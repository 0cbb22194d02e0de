"""The hardening policy as data: what every sandbox container is created with."""

from __future__ import annotations

import pytest

from app.sandbox.policy import CAP_ADD, MANAGED_LABEL, SandboxConfig, container_config


def make_config(**overrides: object) -> SandboxConfig:
    options: dict[str, object] = {"image": "img:1", "labels": {"sandhive.task": "tsk_1"}}
    return SandboxConfig(**{**options, **overrides})  # type: ignore[arg-type]


def test_container_config_is_hardened() -> None:
    body = container_config(make_config(cpus=1.5, memory_mb=512, pids_limit=128))
    host = body["HostConfig"]
    assert body["Image"] == "img:1"
    assert body["Cmd"] == ["sleep", "infinity"]
    assert body["WorkingDir"] == "/testbed"
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert set(host["CapAdd"]) == set(CAP_ADD)
    assert not {"NET_RAW", "MKNOD", "SYS_ADMIN", "SYS_CHROOT", "SETFCAP"} & set(host["CapAdd"])
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Init"] is True
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is False
    assert host["PidsLimit"] == 128
    assert host["Memory"] == host["MemorySwap"] == 512 * 2**20
    assert host["NanoCpus"] == 1_500_000_000
    assert host["Binds"] == host["Mounts"] == host["Devices"] == []
    assert host["RestartPolicy"] == {"Name": "no"}
    assert host["IpcMode"] == "private"
    assert host["Ulimits"]


def test_labels_carry_the_managed_mark() -> None:
    body = container_config(make_config())
    assert body["Labels"] == {"sandhive.task": "tsk_1", MANAGED_LABEL: "1"}


def test_env_is_the_reference_env_plus_extras() -> None:
    env = container_config(make_config(env={"FOO": "bar"}))["Env"]
    values = dict(item.split("=", 1) for item in env)
    assert values["PATH"].split(":")[:6] == [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    assert "/root/.local/bin" in values["PATH"].split(":")
    assert values["PIP_DISABLE_PIP_VERSION_CHECK"] == "1"
    assert values["PIP_ROOT_USER_ACTION"] == "ignore"
    assert values["PIP_NO_WARN_SCRIPT_LOCATION"] == "0"
    assert values["LANG"] == "C.UTF-8"
    assert values["FOO"] == "bar"


@pytest.mark.parametrize(
    "overrides",
    [
        {"network": "bridge"},
        {"cpus": 0},
        {"memory_mb": 0},
        {"pids_limit": 0},
        {"workdir": "testbed"},
        {"env": {"A=B": "x"}},
    ],
)
def test_invalid_configs_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        make_config(**overrides)
