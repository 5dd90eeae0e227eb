"""``listeners[].http3``: only on a TLS HTTP listener, with one process or with workers, and a
missing aioquic named as the extra to install; each refusal names the field."""

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


@pytest.mark.parametrize("workers", ["2", "auto"])
def test_http3_with_workers(pem: str, workers: str) -> None:
    """A UDP socket per worker, steered by connection id (docs/http3.md, Workers)."""
    cfg = load_config_text(config(f"    tls: {{certificate: {pem}, key: {pem}}}\n"
                                  "    http3: {}\n", f"workers: {workers}\n"))
    assert cfg.listeners[0].http3 is not None


def test_http3_without_aioquic_names_the_extra(pem: str, monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "aioquic" else real(name, *a))
    got = problem(config(f"    tls: {{certificate: {pem}, key: {pem}}}\n    http3: {{}}\n"))
    assert "listeners[0].http3: listeners[].http3 needs aioquic, an optional dependency: " \
           "pip install 'lameduck[http3]'" in got, got
