"""The egress proxy: the one way out of an `egress` sandbox on a server that filters by name.

Standard library only, and only relative imports inside this package (an import-linter
contract holds it): the worker copies these files into a host directory mounted into the
proxy's container (the sandbox image, which has no Sandhive code) and runs `python3 -m
egress` there. `rules` (names, patterns, addresses) and `hello` (the ClientHello's SNI) are
pure and unit-tested; `proxy` is the asyncio server, `control` the worker's Unix-socket
channel to it. `app.config` and `app.domain.resolve` import `rules` to check settings and requests,
and `app.services.webhooks.net` to judge webhook addresses by the proxy's own policy.
The worker's side (the container, per-task networks, the host rule) is
`app.sandbox.egress_proxy`; the design is in docs/network.md.
"""
