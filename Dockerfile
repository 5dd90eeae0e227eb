# lameduck's image: `docker build -t lameduck:0.1.0 .` at the repository root.
#
# Two stages: the first builds the wheel from this source tree with the hot path compiled by
# mypyc (setup.py; gcc and the C library's headers are installed there, and only there), the
# second installs it with its dependencies into a venv of a slim image (no compiler) and runs
# `lameduck supervise` (SIGTERM drains, SIGHUP hot-restarts: docs/hot-restart.md) as a user
# that is not root. The config is deploy/kubernetes/lameduck.yaml (listener on 0.0.0.0:8000,
# proxying to 127.0.0.1:8080 in the same pod); mount your own over it:
#   docker run -v $PWD/my.yaml:/etc/lameduck/lameduck.yaml:ro -p 8000:8000 lameduck:0.1.0
# or pass another: `docker run lameduck:0.1.0 -c /path/in/the/container.yaml`.

FROM python:3.12-slim AS wheel
WORKDIR /src
# The image's Python has its headers; the compiler is the builder's alone.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && pip install --no-cache-dir "build>=1.0"
COPY pyproject.toml setup.py README.md ./
COPY src ./src
# LAMEDUCK_MYPYC=1: a wheel that cannot be compiled fails the build instead of shipping the
# pure-Python fallback
RUN LAMEDUCK_MYPYC=1 python -m build --wheel --outdir /dist

FROM python:3.12-slim
ENV PATH=/opt/lameduck/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=wheel /dist/ /tmp/dist/
RUN python -m venv /opt/lameduck \
    && /opt/lameduck/bin/pip install --no-cache-dir /tmp/dist/lameduck-*.whl \
    && rm -rf /tmp/dist \
    && lameduck --version | grep -F "(compiled: mypyc)" \
    && groupadd --system --gid 10001 lameduck \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
       --shell /usr/sbin/nologin lameduck
COPY deploy/kubernetes/lameduck.yaml /etc/lameduck/lameduck.yaml
USER 10001:10001
# The listener of the config above. The admin API (9901) is not exposed: it can drain and stop
# the proxy, so lameduck binds it to loopback only (admin.allow_non_loopback).
EXPOSE 8000
# Healthy while /ready answers 200 (503 once draining). Asked on the admin address lameduck
# wrote at start (--admin-address-path below), so a mounted config may move the admin port;
# python's urllib, as the slim image has no curl.
HEALTHCHECK --interval=5s --timeout=3s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; a = open('/tmp/lameduck-admin').read().strip(); u.urlopen(f'http://{a}/ready', timeout=2)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["lameduck", "supervise", "--admin-address-path", "/tmp/lameduck-admin"]
CMD ["-c", "/etc/lameduck/lameduck.yaml"]
