"""Upstream servers for the egress-by-name tests: HTTP and HTTPS on a network the test makes.

A CA made here signs one certificate for every test name; the upstream (the sandbox
image running a small Python server) answers `hello <Host> <path>` on 80 and 443, and a
1 MiB body on `/big`. No name is ever looked up: the proxy gets them from its fixed
answers (`ProxyPolicy.hosts`), so nothing leaves this machine.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

IMAGE = "sandhive-sandbox:latest"
NAMES = ("good.test", "a.ok.test", "alt.test", "other.test")
SERVER = r"""
import http.server, ssl, threading
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"x" * 2**20 if self.path == "/big" else (
            f"hello {self.headers.get('Host')} {self.path}\n".encode())
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
plain = http.server.ThreadingHTTPServer(("0.0.0.0", 80), Handler)
tls = http.server.ThreadingHTTPServer(("0.0.0.0", 443), Handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/srv/cert.pem", "/srv/key.pem")
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
threading.Thread(target=plain.serve_forever, daemon=True).start()
tls.serve_forever()
"""


@dataclass(frozen=True)
class Upstream:
    network: str
    subnet: str
    address: str
    ca: Path
    """The test CA's certificate (PEM): the sandbox's CA bundle."""


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


def make_certificates(folder: Path) -> Path:
    """A CA and a server certificate for NAMES; the CA's path."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandhive test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAMES[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "cert.pem").write_bytes(cert.public_bytes(pem))
    (folder / "key.pem").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (folder / "serve.py").write_text(SERVER)
    for path in folder.iterdir():
        path.chmod(0o644)
    folder.chmod(0o755)
    return folder / "ca.pem"


@dataclass
class Started:
    network: str
    container: str


def upstream_servers(folder: Path, image: str = IMAGE) -> Iterator[Upstream]:
    """The upstream (a container of `image`) on a network of the test's own; removed
    afterwards."""
    tag = f"shvt-up-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    ca = make_certificates(folder)
    try:
        run("docker", "network", "create", tag)
        run(
            "docker", "run", "-d", "--name", tag, "--network", tag,
            "-v", f"{folder}:/srv:ro", image, "python3", "/srv/serve.py",
        )  # fmt: skip
        address = run(
            "docker", "inspect", "-f",
            "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", tag,
        )  # fmt: skip
        subnet = json.loads(run("docker", "network", "inspect", "-f", "{{json .IPAM}}", tag))
        wait_listening(address, 443)
        yield Upstream(tag, subnet["Config"][0]["Subnet"], address, ca)
    finally:
        subprocess.run(["docker", "rm", "-f", tag], capture_output=True, check=False)
        subprocess.run(["docker", "network", "rm", tag], capture_output=True, check=False)


def wait_listening(address: str, port: int) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection((address, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the upstream server on {address}:{port} did not start")


def private_address(subnet: str) -> str:
    """An address the test maps a name to that is private and not exempt."""
    assert ipaddress.ip_address("10.99.0.5") not in ipaddress.ip_network(subnet)
    return "10.99.0.5"


def remove_proxy(container: str) -> None:
    """The proxy's container and the host rule, as a test leaves them."""
    subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
    for tool in ("iptables", "ip6tables"):
        for argv in (
            [tool, "-w", "10", "-D", "INPUT", "-j", "SHV-IN-proxied"],
            [tool, "-w", "10", "-F", "SHV-IN-proxied"],
            [tool, "-w", "10", "-X", "SHV-IN-proxied"],
        ):
            subprocess.run(argv, capture_output=True, check=False)
