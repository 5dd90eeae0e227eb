"""bench/run.py's TLS rows: the pure parts (the same-cipher check, the CPU-ratio verdict, the
TLS rows and their summary, the generated configs). The bench itself is run by `make bench`."""

from __future__ import annotations


def med(cpu: float, pct: float, rps: float = 10_000.0) -> dict[str, float]:
    return {"cpu_us_per_req": cpu, "proxy_cpu_pct": pct, "rps": rps}


def sample(bench, proxy: str, cpu: float, pct: float, rps: float = 10_000.0):
    return bench.Sample(proxy=proxy, round=1, requests=int(rps * 5), rps=rps, p50_ms=1.0,
                        p99_ms=2.0, errors=0, cpu_us_per_req=cpu, proxy_cpu_pct=pct,
                        cpu_pct={1: 50.0})


def test_same_cipher_everywhere_is_no_problem(bench):
    same = "TLSv1.3 TLS_AES_256_GCM_SHA384"
    assert bench.tls_cipher_problem({"lameduck": same, "haproxy": same}) is None
    assert bench.tls_cipher_problem({}) is None


def test_different_ciphers_are_named(bench):
    problem = bench.tls_cipher_problem({"lameduck": "TLSv1.3 TLS_CHACHA20_POLY1305_SHA256",
                                        "haproxy": "TLSv1.3 TLS_AES_256_GCM_SHA384"})
    assert problem == ("different ciphers negotiated: haproxy TLSv1.3 TLS_AES_256_GCM_SHA384, "
                       "lameduck TLSv1.3 TLS_CHACHA20_POLY1305_SHA256")


def test_cpu_ratio_is_judged_only_when_both_were_saturated(bench):
    assert bench.cpu_ratio_verdict(med(55.0, 99.0), med(50.0, 97.0), 1.2) == (
        "55.0 vs 50.0 µs = 1.10x (met: <= 1.2x)")
    assert bench.cpu_ratio_verdict(med(70.0, 99.0), med(50.0, 97.0), 1.2).endswith(
        "1.40x (NOT met: <= 1.2x)")
    verdict = bench.cpu_ratio_verdict(med(55.0, 99.0), med(50.0, 40.0), 1.2)
    assert verdict.startswith("n/s (not judged: haproxy at 40% proxy CPU")


def test_tls_summary_gives_the_verdict_and_the_cost_over_plain_http(bench):
    tls = [sample(bench, "lameduck", 30.0, 99.0), sample(bench, "haproxy", 25.0, 98.0)]
    h1 = [sample(bench, "lameduck", 16.0, 99.0), sample(bench, "haproxy", 15.0, 98.0)]
    rows, info, failures = bench.summarize_tls(tls, ["lameduck", "haproxy"], 1, {}, h1)
    assert [r[0] for r in rows] == ["lameduck", "haproxy"]
    assert info[0] == ("lameduck CPU per request vs HAProxy: 30.0 vs 25.0 µs = 1.20x "
                       "(met: <= 1.2x)")
    assert "lameduck: 30.0 µs CPU/request over TLS, 16.0 over plain HTTP/1.1 in this run's "\
        "first table (+14.0 µs, 1.88x)" in info
    assert failures == []


def test_a_failed_tls_row_reads_failed(bench):
    tls = [sample(bench, "haproxy", 25.0, 98.0)]
    rows, _, failures = bench.summarize_tls(tls, ["lameduck", "haproxy"], 1,
                                            {"lameduck": "pre-check: boom; no rounds"}, [])
    assert rows[0][:2] == ["lameduck", "FAILED"]
    assert failures == ["lameduck tls: pre-check: boom; no rounds"]


def test_haproxy_tls_frontend_pins_the_suite(bench):
    text = bench.HAPROXY_TLS.format(tls_port=1234, pem="/tmp/x.pem",
                                    suite=bench.TLS_CIPHERSUITE)
    assert ("bind 127.0.0.1:1234 ssl crt /tmp/x.pem alpn http/1.1 ciphersuites "
            "TLS_AES_256_GCM_SHA384") in text
    assert "default_backend origin" in text


def test_a_part_prints_title_table_target_then_what_it_says(bench, capsys) -> None:
    """Every part after the first prints itself one way (``print_part``)."""
    row = ["lameduck", *["1"] * (len(bench.HEADERS) - 1)]
    bench.print_part("TITLE", [row], bench.NO_TARGET_LINE, ["said"], ["broke"], ["noted"])
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "TITLE" and any("lameduck" in line for line in out[2:5])
    assert out[-4:] == [bench.NO_TARGET_LINE, "  said", "  failed: broke", "note: noted"]
