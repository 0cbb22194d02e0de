"""The `sandhive` Inspect sandbox against a real Sandhive: Inspect's conformance suite, and an eval.

Inspect's own checks (`inspect_ai.util._sandbox.self_check`, every one, none marked to fail)
run against one Sandhive sandbox made by the provider's `sample_init`, as Inspect's runner
shares one container across them. Then a real `eval_async` of a small task, whose scripted
model (`mockllm/model`) calls Inspect's `bash()` tool, runs through Inspect's registry and
entry point: the tool's output must be in the sample's messages and its command in the
sandbox's command log on the server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from inspect_ai import Task, eval_async
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import basic_agent
from inspect_ai.tool import bash
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox.registry import registry_find_sandboxenv
from inspect_ai.util._sandbox.self_check import *  # noqa: F403
from sandhive_client import AsyncSandhive
from sandhive_client.inspect_sandbox import SandhiveSandboxConfig, SandhiveSandboxEnvironment

from tests.inspect.conftest import SandhiveAPI, make_key

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the shared sandbox's client lives there


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandhive_env(sandhive_api: SandhiveAPI) -> AsyncIterator[SandboxEnvironment]:
    """One sandbox for every conformance check (each check cleans up after itself)."""
    config = SandhiveSandboxConfig(
        url=sandhive_api.base_url,
        api_key=sandhive_api.key,
        read_only_rootfs=False,  # test_exec_as_user runs adduser
        metadata={"suite": "self_check"},
    )
    task = "sandhive_self_check"
    await SandhiveSandboxEnvironment.task_init(task, config)
    environments = await SandhiveSandboxEnvironment.sample_init(task, config, {})
    try:
        yield environments["default"]
    finally:
        await SandhiveSandboxEnvironment.sample_cleanup(task, config, environments, False)
        await SandhiveSandboxEnvironment.task_cleanup(task, config, True)


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox_env(sandhive_env: SandboxEnvironment) -> SandboxEnvironment:
    """The fixture Inspect's checks ask for, function-scoped as self_check requires."""
    return sandhive_env


async def test_the_provider_is_found_by_name_through_the_entry_point() -> None:
    assert registry_find_sandboxenv("sandhive") is SandhiveSandboxEnvironment
    config = SandhiveSandboxEnvironment.config_deserialize(
        {"url": "http://sandhive:8000", "image": "default", "env": {"A": "1"}}
    )
    assert config == SandhiveSandboxConfig(url="http://sandhive:8000", env={"A": "1"})
    assert hash(config) == hash(SandhiveSandboxConfig(url="http://sandhive:8000", env={"A": "1"}))
    secret = SandhiveSandboxConfig(api_key="shv_secret")
    assert "shv_secret" not in secret.model_dump_json() + repr(secret)


def tool_call(tool: str, arguments: dict[str, str]) -> ModelOutput:
    """A scripted turn calling `tool`, with its usage given: otherwise mockllm counts tokens
    with tiktoken, which downloads its encoding (no network here)."""
    output = ModelOutput.for_tool_call("mockllm/model", tool, arguments)
    output.usage = ModelUsage(input_tokens=10, output_tokens=10, total_tokens=20)
    return output


async def test_a_config_file_a_refused_key_and_cli_cleanup(
    sandhive_api: SandhiveAPI, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--sandbox sandhive:sandhive.yaml`, the server and key from the environment, a bad
    key refused before any sample, and `inspect sandbox cleanup sandhive [ID]` (a tenant of
    its own, so the shared sandbox of the checks is not its to delete)."""
    bad = SandhiveSandboxConfig(url=sandhive_api.base_url, api_key="shv_0_not-a-key")
    with pytest.raises(RuntimeError, match="SANDHIVE_API_KEY"):
        await SandhiveSandboxEnvironment.task_init("refused", bad)

    other = await asyncio.to_thread(make_key, database_url, "inspect-cleanup")
    monkeypatch.setenv("SANDHIVE_URL", sandhive_api.base_url)
    monkeypatch.setenv("SANDHIVE_API_KEY", other.key)
    config = tmp_path / "sandhive.yaml"
    config.write_text("image: default\nttl_s: 900\nmetadata:\n  suite: cli\n")
    await SandhiveSandboxEnvironment.task_init("cli_task", str(config))
    made = [
        await SandhiveSandboxEnvironment.sample_init("cli_task", str(config), {"__sample_id__": n})
        for n in (1, 2)
    ]
    envs = [m["default"].as_type(SandhiveSandboxEnvironment) for m in made]
    try:
        first, second = (env.sandbox for env in envs)
        assert first.info.metadata == {
            "created_by": "inspect",
            "inspect_task": "cli_task",
            "inspect_sample": "1",
            "suite": "cli",
        }
        assert 800 < (first.info.expires_at - first.info.created_at).total_seconds() <= 905
        assert (await envs[1].exec(["cat", "/etc/hostname"])).success

        await SandhiveSandboxEnvironment.cli_cleanup(first.id)
        assert (await first.refresh()).end_reason == "deleted"
        assert (await second.refresh()).status == "running"
        await SandhiveSandboxEnvironment.cli_cleanup(None)
        assert (await second.refresh()).end_reason == "deleted"
    finally:
        for env in envs:
            await env.client.close()


# Two warnings of inspect-ai 0.3.285 itself, with any sandbox ("local" too): its model retry
# policy uses tenacity's deprecated `initial=`, and its sample event emitter
# (inspect_ai/hooks/_hooks.py) never closes the receive end of its memory stream.
@pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function MemoryObjectReceiveStream.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)
async def test_an_eval_runs_its_bash_tool_in_a_sandhive_sandbox(
    sandhive_api: SandhiveAPI, tmp_path: Path
) -> None:
    run = uuid.uuid4().hex
    config = SandhiveSandboxConfig(
        url=sandhive_api.base_url, api_key=sandhive_api.key, metadata={"run": run}
    )
    command = "echo hello > /tmp/x; cat /tmp/x"
    model = get_model(
        "mockllm/model",
        custom_outputs=[
            tool_call("bash", {"command": command}),
            tool_call("bash", {"command": "cat data.txt"}),
            tool_call("submit", {"answer": "hello"}),
        ],
    )
    task = Task(
        dataset=[
            Sample(
                id="greeting",
                input="Write hello to /tmp/x and show it.",
                target="hello",
                files={"data.txt": "from the sample"},
            )
        ],
        solver=basic_agent(tools=[bash(timeout=60)], message_limit=20),
        scorer=includes(),
        sandbox=("sandhive", config),
    )
    (log,) = await eval_async(task, model=model, log_dir=str(tmp_path))
    assert log.status == "success", log.error
    assert log.samples is not None
    (sample,) = log.samples
    tool_results = [m.text for m in sample.messages if m.role == "tool"]
    assert tool_results[:2] == ["hello\n", "from the sample"], sample.messages
    assert sample.scores is not None
    assert sample.scores["includes"].value == "C"

    async with AsyncSandhive(sandhive_api.base_url, api_key=sandhive_api.key) as client:
        ended = (await client.sandboxes.list(status="ended", limit=100)).items
        (info,) = [s for s in ended if s.metadata.get("run") == run]
        assert info.end_reason == "deleted"  # sample_cleanup deleted it
        assert info.metadata["created_by"] == "inspect"
        assert info.metadata["inspect_sample"] == "greeting"
        sandbox = await client.sandboxes.get(info.id)
        argvs = [c.argv for c in (await sandbox.commands()).items]
    assert ["bash", "--login", "-c", command] in argvs
    assert ["bash", "--login", "-c", "cat data.txt"] in argvs
