"""``listeners[].http3``: only on a TLS HTTP listener, only with one process, and a missing
aioquic named as the extra to install; each refusal names the field."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import trustme

import lameduck.listeners  # noqa: F401  (registers the format check, as every command does)
from lameduck.config import ConfigError, load_config_text


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("h3cfg") / "server.pem"
    trustme.CA().issue_cert("localhost").private_key_and_cert_chain_pem.write_to_path(
        str(path))
    return str(path)


def config(listener: str, top: str = "") -> str:
    return (f"{top}listeners:\n  - name: ingress\n    address: 127.0.0.1:0\n{listener}"
            "    routes: [{prefix: /, cluster: app}]\n"
            "clusters: [{name: app, endpoints: [127.0.0.1:8080]}]\n")


def problem(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config_text(text, "lameduck.yaml")
    return str(err.value)


def test_http3_on_a_tls_listener(pem: str) -> None:
    cfg = load_config_text(config(
        f"    tls: {{certificate: {pem}, key: {pem}}}\n    http3: {{alt_svc_max_age: 1h}}\n"))
    h3 = cfg.listeners[0].http3
    assert h3 is not None and h3.alt_svc_max_age == 3600.0
    assert load_config_text(config(
        f"    tls: {{certificate: {pem}, key: {pem}}}\n")).listeners[0].http3 is None


def test_http3_without_tls_is_refused() -> None:
    assert problem(config("    http3: {}\n")) == (
        "lameduck.yaml: listeners[0].http3: needs `tls` on an HTTP listener (QUIC is always "
        "encrypted, RFC 9001)")


def test_http3_with_workers_is_refused(pem: str) -> None:
    assert "listeners[0].http3: not with workers other than 1 yet" in problem(config(
        f"    tls: {{certificate: {pem}, key: {pem}}}\n    http3: {{}}\n", "workers: 2\n"))


def test_http3_without_aioquic_names_the_extra(pem: str, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aioquic" else real(name, *a))
    got = problem(config(f"    tls: {{certificate: {pem}, key: {pem}}}\n    http3: {{}}\n"))
    assert "listeners[0].http3: listeners[].http3 needs aioquic, an optional dependency: " \
           "pip install 'lameduck[http3]'" in got, got
