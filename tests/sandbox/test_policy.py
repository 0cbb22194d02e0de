"""The hardening policy as data: what every sandbox container is created with."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import Settings
from app.runner.episode import sandbox_caps
from app.sandbox.network import BLOCKED_V4, chain_names, firewall_rules, normalize_allow
from app.sandbox.policy import (
    BASE_ENV,
    CA_BUNDLE_PATH,
    CAP_ADD,
    MANAGED_LABEL,
    SCRATCH_DIRS,
    EgressPolicy,
    SandboxCaps,
    SandboxConfig,
    container_config,
    sandbox_config,
)

EGRESS = EgressPolicy(network="shv-net", bridge="shv-br0")
CAPS = SandboxCaps(image="img:1", max_cpus=2.0, max_memory_mb=2048, max_disk_mb=4096)


def make_config(**overrides: object) -> SandboxConfig:
    options: dict[str, object] = {"image": "img:1", "labels": {"sandhive.task": "tsk_1"}}
    return SandboxConfig(**{**options, **overrides})  # type: ignore[arg-type]


def env_of(body: dict[str, Any]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in body["Env"])


def test_container_config_is_hardened() -> None:
    body = container_config(make_config(cpus=1.5, memory_mb=512, disk_mb=256, pids_limit=128))
    host = body["HostConfig"]
    assert body["Image"] == "img:1"
    assert body["Cmd"] == ["sleep", "14400"]  # defaults.SANDBOX_DEADLINE_S: never infinity
    assert host["AutoRemove"] is True  # ended at its deadline, Docker removes it and its volume
    assert body["WorkingDir"] == "/testbed"
    assert body["User"] == ""  # root with CapDrop ALL: the documented deviation of C1.1
    assert host["NetworkMode"] == "none"
    assert host["CapDrop"] == ["ALL"]
    assert set(host["CapAdd"]) == set(CAP_ADD)
    assert not {"NET_RAW", "MKNOD", "SYS_ADMIN", "SYS_CHROOT", "SETFCAP"} & set(host["CapAdd"])
    assert host["SecurityOpt"] == ["no-new-privileges"]
    assert host["Init"] is True
    assert host["Privileged"] is False
    assert host["ReadonlyRootfs"] is True
    assert host["PidsLimit"] == 128
    # The workdir is RAM: the memory limit holds the processes' share and the disk's.
    assert host["Memory"] == host["MemorySwap"] == (512 + 256) * 2**20
    assert host["NanoCpus"] == 1_500_000_000
    assert host["OomKillDisable"] is False
    assert host["Binds"] == host["Devices"] == []
    assert host["PortBindings"] == {}
    assert host["PublishAllPorts"] is False
    assert host["RestartPolicy"] == {"Name": "no"}
    assert host["IpcMode"] == "private"
    assert host["CgroupnsMode"] == "private"
    assert host["LogConfig"]["Type"] == "none"
    assert {limit["Name"] for limit in host["Ulimits"]} == {"nofile", "core"}


def test_workdir_is_a_size_capped_tmpfs_volume_removed_with_the_container() -> None:
    body = container_config(make_config(disk_mb=300))
    [mount] = body["HostConfig"]["Mounts"]
    assert mount["Type"] == "volume"
    assert mount["Target"] == "/testbed"
    assert "Source" not in mount  # anonymous: `docker rm -v` removes it with the container
    driver = mount["VolumeOptions"]["DriverConfig"]
    assert driver["Name"] == "local"
    assert driver["Options"]["type"] == "tmpfs"
    options = driver["Options"]["o"].split(",")
    assert "size=300m" in options
    assert "nosuid" in options
    assert "nodev" in options
    assert any(option.startswith("nr_inodes=") for option in options)
    assert mount["VolumeOptions"]["Labels"][MANAGED_LABEL] == "1"


def test_scratch_dirs_are_size_capped_tmpfs() -> None:
    tmpfs = container_config(make_config(scratch_mb=64))["HostConfig"]["Tmpfs"]
    assert set(tmpfs) == set(SCRATCH_DIRS)
    for path, options in tmpfs.items():
        parts = options.split(",")
        assert "size=64m" in parts
        assert "nosuid" in parts
        assert f"mode={SCRATCH_DIRS[path]}" in parts


def test_writable_rootfs_is_an_explicit_choice() -> None:
    body = container_config(make_config(read_only_rootfs=False))
    assert body["HostConfig"]["ReadonlyRootfs"] is False
    assert "PIP_BREAK_SYSTEM_PACKAGES" not in env_of(body)


def test_labels_carry_the_managed_mark() -> None:
    body = container_config(make_config())
    assert body["Labels"] == {"sandhive.task": "tsk_1", MANAGED_LABEL: "1"}


def test_env_is_the_reference_env_plus_the_policy_and_extras() -> None:
    values = env_of(container_config(make_config(env={"FOO": "bar"})))
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
    assert values["PIP_BREAK_SYSTEM_PACKAGES"] == "1"  # read-only root: pip uses /root/.local
    assert values["FOO"] == "bar"
    assert set(values) == {*BASE_ENV, "PIP_BREAK_SYSTEM_PACKAGES", "FOO"}


def test_no_service_setting_reaches_the_sandbox_env() -> None:
    settings = Settings(
        _env_file=None,
        llm_api_key="sk-secret-llm-key",
        admin_api_key="admin-secret",
        database_url="postgresql+asyncpg://u:pg-secret@db/x",
        redis_url="redis://:redis-secret@r:6379/0",
    )
    cfg = sandbox_config(
        sandbox_caps(settings), labels={}, cpus=1, memory_mb=512, disk_mb=64, network="none"
    )
    text = repr(container_config(cfg))
    for secret in ("sk-secret-llm-key", "admin-secret", "pg-secret", "redis-secret", "SANDHIVE_"):
        assert secret not in text


def test_egress_attaches_to_the_dedicated_network_only() -> None:
    body = container_config(make_config(network="egress", egress=EGRESS))
    assert body["HostConfig"]["NetworkMode"] == "shv-net"
    assert body["HostConfig"]["PortBindings"] == {}
    # An egress policy alone does not open the network: the mode decides.
    assert container_config(make_config(egress=EGRESS))["HostConfig"]["NetworkMode"] == "none"


def test_ca_bundle_is_mounted_read_only_for_egress_sandboxes_only() -> None:
    body = container_config(
        make_config(network="egress", egress=EGRESS, ca_bundle="/etc/ssl/certs/ca.crt")
    )
    binds = [m for m in body["HostConfig"]["Mounts"] if m["Type"] == "bind"]
    assert binds == [
        {
            "Type": "bind",
            "Source": "/etc/ssl/certs/ca.crt",
            "Target": CA_BUNDLE_PATH,
            "ReadOnly": True,
        }
    ]
    env = env_of(body)
    for name in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT"):
        assert env[name] == CA_BUNDLE_PATH
    offline = container_config(make_config(ca_bundle="/etc/ssl/certs/ca.crt"))
    assert [m["Type"] for m in offline["HostConfig"]["Mounts"]] == ["volume"]
    assert "SSL_CERT_FILE" not in env_of(offline)


def test_sandbox_config_takes_only_capped_values_from_the_task() -> None:
    cfg = sandbox_config(
        CAPS, labels={"a": "b"}, cpus=2.0, memory_mb=2048, disk_mb=4096, network="none"
    )
    assert (cfg.image, cfg.cpus, cfg.memory_mb, cfg.disk_mb) == ("img:1", 2.0, 2048, 4096)
    assert cfg.pids_limit == CAPS.pids_limit
    assert cfg.read_only_rootfs is True


@pytest.mark.parametrize(
    "request_",
    [
        {"cpus": 2.5},
        {"cpus": 0},
        {"memory_mb": 4096},
        {"memory_mb": 8},
        {"disk_mb": 5000},
        {"disk_mb": 0},
        {"network": "egress"},  # not enabled in CAPS
        {"network": "host"},
        {"network": "bridge"},
    ],
)
def test_sandbox_config_refuses_what_the_caps_do_not_allow(request_: dict[str, Any]) -> None:
    values: dict[str, Any] = {"cpus": 1.0, "memory_mb": 512, "disk_mb": 64, "network": "none"}
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        sandbox_config(CAPS, labels={}, **{**values, **request_})


def test_egress_is_allowed_once_the_server_enables_it() -> None:
    caps = SandboxCaps(
        image="i", max_cpus=1, max_memory_mb=512, max_disk_mb=64, egress=EGRESS, ca_bundle="/ca"
    )
    cfg = sandbox_config(caps, labels={}, cpus=1, memory_mb=512, disk_mb=64, network="egress")
    assert cfg.egress == EGRESS
    assert cfg.ca_bundle == "/ca"
    none = sandbox_config(caps, labels={}, cpus=1, memory_mb=512, disk_mb=64, network="none")
    assert none.egress is None
    assert none.ca_bundle is None


def test_settings_become_caps() -> None:
    settings = Settings(
        _env_file=None,
        sandbox_egress_enabled=True,
        sandbox_egress_allow="192.0.2.0/24",
        sandbox_ca_bundle="/etc/ssl/certs/ca-certificates.crt",
    )
    caps = sandbox_caps(settings)
    assert caps.egress == EgressPolicy(
        network="sandhive-egress", bridge="shv-egress0", allow=("192.0.2.0/24",)
    )
    assert caps.ca_bundle == "/etc/ssl/certs/ca-certificates.crt"
    assert sandbox_caps(Settings(_env_file=None)).egress is None


@pytest.mark.parametrize(
    "overrides",
    [
        {"network": "bridge"},
        {"network": "egress"},  # without an egress policy
        {"cpus": 0},
        {"memory_mb": 0},
        {"pids_limit": 0},
        {"disk_mb": 0},
        {"workdir": "testbed"},
        {"workdir": "/tmp"},
        {"ca_bundle": "relative.crt"},
        {"env": {"A=B": "x"}},
    ],
)
def test_invalid_configs_are_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each case has its own message
        make_config(**overrides)


def test_firewall_blocks_host_private_and_sandbox_to_sandbox() -> None:
    text = firewall_rules(EGRESS)
    rules = text.splitlines()
    fwd, inp = chain_names("shv-br0")
    assert rules[0] == "*filter"
    assert rules[-1] == "COMMIT"
    assert text.endswith("\n")
    assert f"-A {fwd} -i shv-br0 -o shv-br0 -j DROP" in rules
    for cidr in BLOCKED_V4:
        assert f"-A {fwd} -i shv-br0 -d {cidr} -j DROP" in rules
    assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(BLOCKED_V4)
    assert "100.64.0.0/10" in BLOCKED_V4
    assert rules.index(f"-A {inp} -i shv-br0 -j DROP") > 0  # the host itself
    assert not any("ACCEPT" in rule and "-i shv-br0" in rule for rule in rules)
    assert f"-A {fwd} -j RETURN" in rules  # public destinations continue to Docker's chains


def test_an_allow_list_allows_only_itself_before_any_block() -> None:
    policy = EgressPolicy(network="n", bridge="br1", allow=("172.30.0.5", "203.0.113.0/24"))
    rules = firewall_rules(policy).splitlines()
    fwd, inp = chain_names("br1")
    allow = rules.index(f"-A {fwd} -i br1 -d 172.30.0.5/32 -j ACCEPT")
    block = rules.index(f"-A {fwd} -i br1 -d 172.16.0.0/12 -j DROP")
    rest = rules.index(f"-A {fwd} -i br1 -j DROP")
    assert allow < block < rest
    assert f"-A {inp} -i br1 -d 203.0.113.0/24 -j ACCEPT" in rules


@pytest.mark.parametrize("bad", ["::1/128", "fe80::/10", "not-a-cidr", "10.0.0.0/33"])
def test_allow_list_accepts_ipv4_cidrs_only(bad: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011
        normalize_allow((bad,))
