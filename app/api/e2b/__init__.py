"""The E2B API on Sandhive's sandboxes (docs/e2b.md): the `e2b` SDK, and every tool with an E2B
backend, runs against a self-hosted Sandhive by its environment (`E2B_API_URL`,
`E2B_SANDBOX_URL`, `E2B_API_KEY`).

`control` is E2B's REST control plane under `/e2b` (create, list, get, timeout, connect,
kill); `envd` is what the SDK speaks to a sandbox under `/e2b/envd`: the Connect RPC
services of E2B's `envd` (processes, filesystem; `process`, `filesystem`) and its `/files`
upload and download, routed to the sandbox its `E2b-Sandbox-Id` header names. Both are
adapters over `services.sandboxes`: a sandbox made here is a `/v1/sandboxes` sandbox, with
its tenancy, limits, audit log and page.
"""
