"""One episode: a fresh sandbox, a model and the agent loop, from inputs to collected outputs.

`Runner` is the one way to run a task's episode: the worker, `sandhive run` and
every later way of starting one call it with a resolved `TaskSpec`. It knows
nothing of Postgres or Redis; whoever calls it decides where steps and files go
(through the EventSink and the returned files). A vanilla task (`TaskSpec.mode`) is
one model call without a sandbox (`app.agent.vanilla`), returned the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import httpx

from app import metrics
from app.agent.loop import run_agent
from app.agent.pending_sandbox import PendingSandbox
from app.agent.types import AgentSpec, ChatModel, EventSink, Outcome, Resume, Sandbox
from app.agent.vanilla import VanillaSpec, embed_documents, run_vanilla
from app.config import Settings
from app.domain.image_catalogue import catalogue_or_default, warm_sizes
from app.domain.prompt_configs import render_prompts, stored_prompt
from app.errors import InvalidInput, SandboxError
from app.llm.profiles import HTTPChatModel, model_for_profile
from app.llm.transport import shared_http_client
from app.runner import verifier
from app.runner.replay import RecordedTurn, history_at
from app.sandbox import snapshot as snapshots
from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.egress_proxy import proxy_policy
from app.sandbox.files import CollectCaps, CollectedFile
from app.sandbox.policy import EgressPolicy, SandboxCaps, SandboxConfig, sandbox_config
from app.sandbox.pool import WarmPool
from app.specs import LLMSpec, TaskSpec, VerifierSpec
from app.states import FinishReason, timeout_error

ANSWER_FILE = "answer.txt"
VERIFIER_GRACE_S = 240
"""A verified sandbox lives this much past its verifier's timeout: its other steps (the
agent's processes stopped, the files in, the reward read out: a minute each at most)."""
VERIFIED_ENDS = frozenset(
    {
        FinishReason.submitted,
        FinishReason.max_steps,
        FinishReason.context_limit,
        FinishReason.timeout,
    }
)
SandboxHook = Callable[[DockerSandbox | None], None]
"""Told a task's sandbox once it is ready to run, and None before it is removed."""
REMOVALS_AT_ONCE = 2
"""Background removals that run at once (the rest wait their turn): a hundred episodes
ending together would otherwise make runc and dockerd take both cores from the steps
and final steps of the episodes still open."""
REMOVAL_WAIT_S = 120.0
T = TypeVar("T")
FIRST = asyncio.FIRST_COMPLETED
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Episode:
    """A task's episode with every server policy applied: what `Runner.play` runs."""

    agent: AgentSpec
    sandbox: SandboxConfig
    inputs: Sequence[tuple[str, bytes]]
    input_dir: str
    output_dir: str
    collect_grace_s: float
    """Time the output collection still gets when the loop used up the task's wall clock."""
    verifier: VerifierSpec | None = None
    """Run in the sandbox once the agent has ended (`app.runner.verifier`)."""
    pooled: bool = True
    """False: never from (nor taught to) the warm pool (a tenant's own image, a verified
    task's extra mounts: one tenant's shapes must not hold the pool's slots)."""
    snapshot: snapshots.Unpack | None = None
    """A fork's sandbox: another's writable files (`app.sandbox.snapshot`), unpacked in
    place of the inputs before the loop goes on from `Resume` (and then let go of)."""


@dataclass
class EpisodeResult:
    outcome: Outcome
    files: list[CollectedFile] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    verification: dict[str, Any] | None = None
    """What the task's verifier found (`VerificationOut`'s JSON); None without one, or when
    the agent's end leaves nothing to verify (cancelled, the model or the sandbox failed)."""
    diverged: dict[str, Any] | None = None
    """A fork's replay allowed to diverge: the first step that answered otherwise."""

    def answer(self, max_bytes: int) -> str | None:
        """The text of output/answer.txt, capped, or None when the agent wrote none."""
        for item in self.files:
            if item.path == ANSWER_FILE:
                return item.content[:max_bytes].decode("utf-8", errors="replace")
        return None


class Runner:
    """Runs episodes for one process: the server's caps, one Docker host, its warm pool and
    shared HTTP client, all fixed once, so that a task brings only its resolved spec."""

    def __init__(
        self,
        settings: Settings,
        docker: DockerHost,
        *,
        pool: WarmPool | None = None,
        http: httpx.AsyncClient | None = None,
        remove_in_background: bool = False,
    ) -> None:
        self.settings, self.docker, self.pool, self.http = settings, docker, pool, http
        self._remove_in_background = remove_in_background
        """Remove a finished episode's sandbox after `play` returns (`drain` waits for it):
        the task's end is not held up by Docker's teardown (~0.1 s of a K=10 task)."""
        self._removals: set[asyncio.Task[None]] = set()
        self._removing_at_once = asyncio.Semaphore(REMOVALS_AT_ONCE)
        self.sandbox_caps = sandbox_caps(settings)
        self.collect_caps = CollectCaps(
            max_files=settings.artifact_max_files,
            max_file_bytes=settings.artifact_max_file_bytes,
            max_total_bytes=settings.artifact_max_total_bytes,
        )

    def model(self, llm: LLMSpec, session: str | None = None) -> HTTPChatModel:
        """The model client for a task's LLM spec: its profile's kind, URL and key; the
        rollout's own (allowed) URL instead when it names one, with the rollout key (never
        the profile's), and `session` (the task id) in the session header so a trainer's
        router keeps the rollout on one replica."""
        s = self.settings
        profile = s.llm_profiles().get(llm.profile)
        if profile is None:
            raise InvalidInput(f"unknown LLM profile {llm.profile!r}")
        tell_session = profile.session_header
        if llm.base_url is not None:
            # Checked again here: the worker's allow-list is the one in force when it calls.
            allowed = {url.rstrip("/") for url in s.llm_allowed_base_urls}
            if llm.base_url.rstrip("/") not in allowed:
                raise InvalidInput("llm.base_url is no longer in SANDHIVE_LLM_ALLOWED_BASE_URLS")
            update = {"base_url": llm.base_url, "api_key": s.llm_rollout_api_key}
            profile = profile.model_copy(update=update)
            tell_session = True
        header = s.llm_session_header if tell_session else ""
        return model_for_profile(
            profile,
            continuous=llm.tokens == "continuous",
            model=llm.model,
            temperature=llm.temperature,
            max_tokens=llm.max_tokens_per_call,
            extra_body=llm.extra_body,
            timeout_s=s.llm_timeout_s,
            max_retries=s.llm_max_retries,
            backoff_s=s.llm_retry_backoff_s,
            client=self.http,
            extra_headers={header: session} if header and session else None,
            capture=llm.capture,
        )

    def caps_for(self, image_name: str) -> SandboxCaps:
        """The server's caps for one catalogue image: its reference (this worker's catalogue
        says which, as it said when the worker chose to claim the task), maxima and pids
        limit; ValueError for an image the catalogue does not have."""
        image = catalogue_or_default(self.settings).get(image_name)
        if image is None:
            raise ValueError(f"sandbox image {image_name!r} is not in this server's catalogue")
        return replace(
            self.sandbox_caps,
            image=image.reference,
            max_cpus=image.max_cpus,
            max_memory_mb=image.max_memory_mb,
            max_disk_mb=image.max_disk_mb,
            pids_limit=image.pids_limit,
        )

    def episode(
        self,
        spec: TaskSpec,
        problem: str,
        *,
        labels: Mapping[str, str],
        inputs: Sequence[tuple[str, bytes]] = (),
    ) -> Episode:
        """The episode of a resolved task; its sandbox request passes the server's caps here
        (ValueError otherwise), whatever the API already checked."""
        workdir = self.settings.sandbox_workdir
        prompt = stored_prompt(spec.prompt, spec.prompt_config, workdir=workdir)
        system, user = render_prompts(prompt, problem)
        limits, tools, box = spec.limits, spec.tools, spec.sandbox
        caps = self.caps_for(box.image_name)
        if box.built is not None:  # a tenant's own image: its tag, within its base's caps
            caps = replace(caps, image=box.image)
        if not box.read_only_rootfs:  # admitted by the API's operator setting
            caps = replace(caps, read_only_rootfs=False)
        verifier_s = spec.verifier.timeout_s + VERIFIER_GRACE_S if spec.verifier else 0
        return Episode(
            agent=AgentSpec(
                system_prompt=system,
                user_prompt=user,
                max_steps=limits.max_steps,
                timeout_s=limits.timeout_s,
                command_timeout_s=limits.command_timeout_s,
                max_context_tokens=limits.max_context_tokens,
                tools_profile=tools.profile,
                tools_shell=tools.shell,
                workdir=workdir,
                answer_all_tool_calls=tools.answer_all_tool_calls,
            ),
            sandbox=sandbox_config(
                caps,
                labels=labels,
                cpus=box.cpus,
                memory_mb=box.memory_mb,
                disk_mb=box.disk_mb,
                network=box.network,
                workdir=workdir,
                deadline_s=sandbox_deadline_s(self.settings, limits.timeout_s + verifier_s),
                allow_domains=tuple(box.allow_domains),
                workdir_on_disk=tools.profile == "reference"
                and self.settings.sandbox_reference_workdir_on_disk,
                extra_scratch=verifier.SCRATCH if spec.verifier else (),
            ),
            inputs=inputs,
            input_dir=prompt.input_dir,
            output_dir=prompt.output_dir,
            collect_grace_s=self.settings.artifact_collect_grace_s,
            verifier=spec.verifier,
            pooled=box.built is None and spec.verifier is None,
        )

    async def run(
        self,
        spec: TaskSpec,
        problem: str,
        sink: EventSink,
        *,
        labels: Mapping[str, str],
        inputs: Sequence[tuple[str, bytes]] = (),
        stop: asyncio.Event | None = None,
        used_s: float = 0.0,
        model: ChatModel | None = None,
        outcome: Outcome | None = None,
        session: str | None = None,
        on_sandbox: SandboxHook | None = None,
        snapshot: bytes | None = None,
        resume_from: Sequence[RecordedTurn] | None = None,
    ) -> EpisodeResult:
        """Run a resolved task to its end (see `play`); never raises for model, sandbox or time
        failures, which become the outcome's finish reason.

        `snapshot` and `resume_from`: a fork from a recorded snapshot (docs/fork.md): its
        sandbox gets the snapshot's files in place of the inputs, and the loop goes on after
        the recorded turns, their history rebuilt (`replay.history_at`), nothing run again.

        `on_sandbox`: told the sandbox once it is ready, and None before it goes (the
        worker's file service reaches a running task's files through it).

        `session`: sent in the session header of every model call (the worker: the task id).

        `model`: None for the client of the spec's LLM profile (closed afterwards).
        `outcome`: the caller's record of steps and usage, filled as the loop goes, so
        it stays right whatever ends the episode (a cancel, an error raised through).
        A vanilla spec runs `play_vanilla` instead: no sandbox, `labels` unused.
        """
        own = None
        if model is None:
            model = own = self.model(spec.llm, session)
        try:
            if spec.mode == "vanilla":
                vanilla = self.vanilla(spec, problem, inputs=inputs)
                result = await self.play_vanilla(
                    vanilla, model, sink, stop=stop, used_s=used_s, outcome=outcome
                )
                if spec.verifier is not None and _verifiable(result.outcome):
                    episode = self.episode(spec, problem, labels=labels)
                    checking = self.verify_reply(episode, result)
                    result.verification = await _until_stopped(checking, result.outcome, stop)
                return result
            episode = self.episode(spec, problem, labels=labels, inputs=inputs)
            if snapshot is not None:
                episode = replace(episode, inputs=(), snapshot=snapshots.Unpack(snapshot))
            resume = None
            if resume_from is not None:
                history = history_at(episode.agent, resume_from)
                resume = Resume(history, len(resume_from))
            return await self.play(
                episode,
                model,
                sink,
                stop=stop,
                used_s=used_s,
                outcome=outcome,
                on_sandbox=on_sandbox,
                resume=resume,
            )
        finally:
            if own is not None:
                await own.aclose()

    def vanilla(
        self, spec: TaskSpec, problem: str, *, inputs: Sequence[tuple[str, bytes]] = ()
    ) -> VanillaSpec:
        """The one call of a vanilla task: the input files, as text and in order, embedded
        before the problem, then the task's templates (by default: none, the problem alone)."""
        documents = [content.decode("utf-8", errors="replace") for _, content in inputs]
        workdir = self.settings.sandbox_workdir
        prompt = stored_prompt(spec.prompt, spec.prompt_config, workdir=workdir)
        system, user = render_prompts(prompt, embed_documents(problem, documents))
        return VanillaSpec(system_prompt=system, user_prompt=user, timeout_s=spec.limits.timeout_s)

    async def play_vanilla(
        self,
        vanilla: VanillaSpec,
        model: ChatModel,
        sink: EventSink,
        *,
        stop: asyncio.Event | None = None,
        used_s: float = 0.0,
        outcome: Outcome | None = None,
    ) -> EpisodeResult:
        """Ask once, without tools or a sandbox; the response text becomes output/answer.txt,
        so the answer is read (`EpisodeResult.answer`) and stored as a sandbox task's is."""
        record = outcome if outcome is not None else Outcome(FinishReason.llm_error)
        result = EpisodeResult(outcome=record)
        left = _Deadline(vanilla.timeout_s, used_s).left()
        call = replace(vanilla, timeout_s=left)
        answer = await _until_stopped(run_vanilla(call, model, sink, record), record, stop)
        if record.finish_reason is FinishReason.timeout:  # the limit, not what was left
            record.error = timeout_error(vanilla.timeout_s)
        if answer is not None:
            result.files = [CollectedFile(ANSWER_FILE, answer.encode("utf-8", "replace"))]
        return result

    async def play(
        self,
        episode: Episode,
        model: ChatModel,
        sink: EventSink,
        *,
        stop: asyncio.Event | None = None,
        used_s: float = 0.0,
        outcome: Outcome | None = None,
        on_sandbox: SandboxHook | None = None,
        synchronous_sandbox: bool = False,
        resume: Resume | None = None,
    ) -> EpisodeResult:
        """Start the sandbox and the loop together, collect the output dir, always remove
        the sandbox.

        The loop's first model call goes out while the sandbox starts; its first tool call
        waits for the start (`PendingSandbox`), whose failure ends the loop as a
        `sandbox_error` (a timeout past the deadline). `synchronous_sandbox`: the sandbox
        is ready before the loop starts (an RL episode: its trainer is handed the first
        turn of a sandbox that exists). Its removal is always in the background when the
        runner removes so, so an RL episode's final step answers without waiting for
        Docker's teardown (~0.2 s, seconds when a hundred end at once); the episode server
        counts the removals in flight (`removing`) against its slots instead, so the
        containers never run ahead of them. A task's removals are bounded by the worker's
        slots (`_dispose`).

        The task's wall clock (`agent.timeout_s`) covers all of it: the sandbox start,
        the loop and the collection (which still gets `collect_grace_s` after a timeout,
        so partial output is kept). It is the task's, not the attempt's: `used_s` is
        what earlier attempts already spent of it (since the first one started), and
        this one gets the rest. Setting `stop` ends the loop at once (a cancel);
        the output so far is still collected. With a warm pool, a ready sandbox of the
        same shape is used when there is one (it is removed afterwards all the same).
        The wait for a sandbox ready to run (inputs in place) is recorded, warm or cold.
        `resume`: a fork's loop, going on from its parent's step (`episode.snapshot`).
        """
        record = outcome if outcome is not None else Outcome(FinishReason.max_steps)
        record.finish_reason = FinishReason.sandbox_error  # until the loop has run
        result = EpisodeResult(outcome=record)
        deadline = _Deadline(episode.agent.timeout_s, used_s)
        starting = asyncio.ensure_future(self._start(episode, deadline))
        if on_sandbox is not None:
            starting.add_done_callback(lambda done: _tell_started(done, on_sandbox))
        try:
            if synchronous_sandbox:
                await asyncio.shield(starting)
            agent = replace(episode.agent, timeout_s=deadline.left())
            pending = PendingSandbox(starting)
            await _run_until_stopped(agent, pending, model, sink, record, stop, resume)
            if record.finish_reason is FinishReason.timeout:  # the limit, not what was left
                record.error = timeout_error(episode.agent.timeout_s)
            box = await _started(pending, record)
            if box is not None:
                async with asyncio.timeout(deadline.left(at_least=episode.collect_grace_s)):
                    collected = await box.collect(episode.output_dir, self.collect_caps)
                result.files, result.skipped = collected.files, collected.skipped
                if episode.verifier is not None and _verifiable(record):
                    checking = self._verify(box, episode.verifier)
                    result.verification = await _until_stopped(checking, record, stop)
        except SandboxError as exc:
            record.finish_reason = FinishReason.sandbox_error
            record.error = exc.message
        except TimeoutError:
            record.finish_reason = FinishReason.timeout
            record.error = timeout_error(episode.agent.timeout_s)
        finally:
            await self._release(starting, on_sandbox, unbounded=synchronous_sandbox)
        return result

    async def verify_reply(self, episode: Episode, result: EpisodeResult) -> dict[str, Any]:
        """A vanilla task's verification: a fresh sandbox of its image, the reply as the
        output directory's answer.txt (none if it gave none), then the verifier."""
        assert episode.verifier is not None
        files = [(ANSWER_FILE, item.content) for item in result.files if item.path == ANSWER_FILE]
        box = None
        try:
            async with asyncio.timeout(episode.sandbox.deadline_s):
                box = await self.docker.create_sandbox(episode.sandbox)
                if files:
                    await box.put_files(episode.output_dir, files)
                return await self._verify(box, episode.verifier, after_agent=False)
        except (SandboxError, TimeoutError) as exc:
            message = exc.message if isinstance(exc, SandboxError) else "timed out"
            return verifier.unavailable(f"the verifier's sandbox failed: {message}")
        finally:
            if box is not None:
                await self._dispose(box)

    async def _verify(
        self, box: DockerSandbox, spec: VerifierSpec, *, after_agent: bool = True
    ) -> dict[str, Any]:
        """The verifier's findings; a failure of Docker (or of ours) is the service's,
        never a reward. A cancel or a hand-back cuts it (`_until_stopped` around it)."""
        caps = self.settings.verifier_output_bytes
        try:
            return await verifier.verify(box, spec, output_bytes=caps, after_agent=after_agent)
        except SandboxError as exc:
            return verifier.unavailable(f"the verifier could not run: {exc.message}")
        except Exception as exc:  # a bug of ours must not cost the task its outputs
            log.exception("the verifier of sandbox %s failed", box.id)
            return verifier.unavailable(f"the verifier could not run: {type(exc).__name__}")

    async def _start(self, episode: Episode, deadline: _Deadline) -> DockerSandbox:
        """The episode's sandbox, within what is left of the task's wall clock."""
        async with asyncio.timeout(deadline.left()):
            return await self._sandbox(episode)

    async def _release(
        self,
        starting: asyncio.Future[DockerSandbox],
        on_sandbox: SandboxHook | None,
        *,
        unbounded: bool = False,
    ) -> None:
        """Remove the episode's sandbox once its start is over: a loop that ended early
        (the model failed, a cancel) waits for the start rather than leave a container."""
        if not starting.done():
            try:
                await asyncio.shield(starting)
            except asyncio.CancelledError:
                # Cancelled while waiting: cut the start, as a cancel always did; its labels
                # and its deadline (`AutoRemove`) see to whatever it had made.
                starting.cancel()
                raise
            except Exception:
                return  # it failed: nothing to remove
        if starting.cancelled() or starting.exception() is not None:
            return
        if on_sandbox is not None:
            on_sandbox(None)
        await self._dispose(starting.result(), unbounded=unbounded)

    @property
    def removing(self) -> int:
        """Sandboxes being removed in the background now."""
        return len(self._removals)

    async def _dispose(
        self, box: DockerSandbox, *, now: bool = False, unbounded: bool = False
    ) -> None:
        """Remove the sandbox now, or in a task `drain` waits for. Either way its labels and
        its deadline (`AutoRemove`) keep the guarantee if this process dies first."""
        # Bounded: past one removal per worker slot, the next waits for its own, so the
        # live containers never run far ahead of the slots when Docker is slow (unless
        # the caller counts `removing` against its own slots: the episode server).
        backlog = not unbounded and len(self._removals) >= self.settings.worker_concurrency
        if now or backlog or not self._remove_in_background:
            await _remove_quietly(box)
            return
        removal = asyncio.create_task(self._remove_in_turn(box))
        self._removals.add(removal)
        removal.add_done_callback(self._removals.discard)

    async def _remove_in_turn(self, box: DockerSandbox) -> None:
        """A background removal, `REMOVALS_AT_ONCE` at a time; one Docker does not answer
        gives its turn up after `REMOVAL_WAIT_S` (its labels and `AutoRemove` deadline see
        to the container) rather than hold every later one."""
        async with self._removing_at_once:
            try:
                async with asyncio.timeout(REMOVAL_WAIT_S):
                    await _remove_quietly(box)
            except TimeoutError:
                log.warning(
                    "removing sandbox %s took over %s s; left to the reaper", box.id, REMOVAL_WAIT_S
                )

    async def drain(self) -> None:
        """Until every background removal has ended (the runner's owner closes after it)."""
        while self._removals:
            await asyncio.gather(*list(self._removals), return_exceptions=True)

    async def _sandbox(self, episode: Episode) -> DockerSandbox:
        """A sandbox of the episode's shape with its inputs in place: warm if the pool has one."""
        asked = time.monotonic()
        box = None
        if self.pool is not None and episode.pooled:
            box = self.pool.claim(episode.sandbox)
        warm = box is not None
        box = box or await self.docker.create_sandbox(episode.sandbox)
        try:
            if episode.snapshot is not None:
                await snapshots.restore(box, episode.snapshot.take())
            elif episode.inputs:
                await box.put_files(episode.input_dir, episode.inputs)
        except BaseException:
            await _remove_quietly(box)
            raise
        metrics.observe_sandbox_start(time.monotonic() - asked, warm=warm)
        return box


@asynccontextmanager
async def open_runner(
    settings: Settings, *, warm_labels: Mapping[str, str] | None = None
) -> AsyncIterator[Runner]:
    """A runner over a Docker host and one shared HTTP client for every model call, and a
    warm pool labelled `warm_labels` when `warm_pool_size` asks for one; all closed after."""
    async with (
        DockerHost(
            exec_channel=settings.sandbox_exec_channel, runtime=settings.sandbox_runtime
        ) as docker,
        shared_http_client() as http,
    ):
        pool = None
        sizes = warm_sizes(catalogue_or_default(settings))
        if warm_labels is not None and any(sizes.values()):
            pool = WarmPool(
                docker,
                size=settings.warm_pool_size,
                sizes=sizes,
                labels=warm_labels,
                max_age_s=settings.warm_pool_max_age_s,
                task_deadline_s=sandbox_deadline_s(settings, settings.max_timeout_s),
            )
        runner = Runner(settings, docker, pool=pool, http=http, remove_in_background=True)
        try:
            yield runner
        finally:
            await runner.drain()
            if pool is not None:
                await pool.close()


def sandbox_deadline_s(settings: Settings, timeout_s: float) -> float:
    """How long a task's sandbox may live: its wall clock, the output collection's grace after
    it, and a grace for the rest (killing a cut command, removal, a slow Docker).

    The whole `timeout_s`, even for a later attempt that gets only what is left of it: an
    upper bound is all the deadline needs. Past it the container is gone, so nothing the
    task may still do can come after it.
    """
    return timeout_s + settings.artifact_collect_grace_s + settings.sandbox_deadline_grace_s


def sandbox_caps(settings: Settings) -> SandboxCaps:
    """The server's sandbox policy: what tasks may choose within, and the fixed knobs."""
    egress = None
    if settings.sandbox_egress_enabled:
        egress = EgressPolicy(
            network=settings.sandbox_egress_network,
            bridge=settings.sandbox_egress_bridge,
            allow=tuple(settings.sandbox_egress_allow),
            manage_firewall=settings.sandbox_egress_firewall,
            proxy=proxy_policy(settings) if settings.sandbox_egress_proxy else None,
        )
    return SandboxCaps(
        image=settings.sandbox_image,
        max_cpus=settings.max_cpus,
        max_memory_mb=settings.max_memory_mb,
        max_disk_mb=settings.max_disk_mb,
        pids_limit=settings.sandbox_pids_limit,
        scratch_mb=settings.sandbox_scratch_mb,
        read_only_rootfs=settings.sandbox_read_only_rootfs,
        egress=egress,
        ca_bundle=str(settings.sandbox_ca_bundle) if settings.sandbox_ca_bundle else None,
        runtime=settings.sandbox_runtime,
    )


class _Deadline:
    """The task's wall clock: what is left of `timeout_s` once `used_s` is spent (None: no limit).

    Monotonic from the episode's start on; `used_s` (earlier attempts, read from
    Postgres timestamps) is the only wall-clock part.
    """

    def __init__(self, timeout_s: float | None, used_s: float = 0.0) -> None:
        self._at = None if timeout_s is None else time.monotonic() + timeout_s - used_s

    def left(self, at_least: float = 0.0) -> float | None:
        return None if self._at is None else max(self._at - time.monotonic(), at_least)


def _verifiable(outcome: Outcome) -> bool:
    """Whether the agent's end leaves something to verify: it submitted or ran out of its
    budget (steps, context, time), not cancelled or failed by the model or the service."""
    return outcome.finish_reason in VERIFIED_ENDS


async def _started(pending: PendingSandbox[DockerSandbox], record: Outcome) -> DockerSandbox | None:
    """The sandbox to collect from; None when its start failed after the loop had ended for
    a reason of its own (a cancel, the model's failure), which then stands: a cancel is
    never reported as an infrastructure failure."""
    try:
        return await pending.ready()
    except (SandboxError, TimeoutError):
        if record.finish_reason in (FinishReason.cancelled, FinishReason.llm_error):
            return None
        raise


def _tell_started(start: asyncio.Future[DockerSandbox], hook: SandboxHook) -> None:
    if not start.cancelled() and start.exception() is None:
        hook(start.result())


async def _run_until_stopped(
    spec: AgentSpec,
    box: Sandbox,
    model: ChatModel,
    sink: EventSink,
    outcome: Outcome,
    stop: asyncio.Event | None,
    resume: Resume | None = None,
) -> None:
    """Run the loop into `outcome`; `cancelled` as soon as `stop` is set (the loop is
    cancelled, its steps and usage so far stay in `outcome`)."""
    await _until_stopped(run_agent(spec, box, model, sink, outcome, resume), outcome, stop)


async def _until_stopped(
    run: Coroutine[Any, Any, T], outcome: Outcome, stop: asyncio.Event | None
) -> T | None:
    """`run`'s result; None and `cancelled` as soon as `stop` is set (`run` is cancelled,
    what it recorded in `outcome` stays)."""
    agent = asyncio.ensure_future(run)
    stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        await asyncio.wait([t for t in (agent, stopped) if t is not None], return_when=FIRST)
    finally:
        for pending in (agent, stopped):
            if pending is not None and not pending.done():
                pending.cancel()
        # The loop's cleanup (killing a running command) finishes before the sandbox goes.
        await asyncio.gather(agent, return_exceptions=True)
    if agent.cancelled():
        outcome.finish_reason, outcome.error = FinishReason.cancelled, "cancelled"
        return None
    return agent.result()  # raises what the loop raised


async def _remove_quietly(box: DockerSandbox) -> None:
    """A failed removal must not replace the episode's result; the container stays labelled."""
    try:
        await box.remove()
    except SandboxError:
        log.warning("could not remove sandbox %s; it stays labelled for cleanup", box.id)
