"""Docker sandboxes: the agent's disposable Linux computer, hardened by default.

The only package that may import aiodocker; it raises `app.errors.SandboxError`.
Imported by the worker, `sandhive run` and the cli, never by the API.
"""

from app.sandbox.docker import DockerHost, DockerSandbox
from app.sandbox.files import CollectCaps, Collected, CollectedFile
from app.sandbox.policy import MANAGED_LABEL, SandboxConfig, container_config

__all__ = [
    "MANAGED_LABEL",
    "CollectCaps",
    "Collected",
    "CollectedFile",
    "DockerHost",
    "DockerSandbox",
    "SandboxConfig",
    "container_config",
]
