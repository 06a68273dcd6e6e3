# queen-pg broker image.
#
#   docker build -t queen-pg .
#   docker run --rm -e DATABASE_URL=postgresql://user:pass@db:5432/queen queen-pg alembic upgrade head
#   docker run -p 6632:6632 -e DATABASE_URL=postgresql://user:pass@db:5432/queen queen-pg
#
# DATABASE_URL is expected: the broker's only durable state lives in that PostgreSQL, and the broker
# applies sql/ to it at boot (idempotent, under an advisory lock). Without DATABASE_URL the image
# would start an embedded PostgreSQL inside the container (data in ./.queen, lost with the
# container, and not writable by the unprivileged user below): that is not the intended container use.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# README.md* matches nothing when there is no README; pyproject.toml keeps the COPY valid.
COPY pyproject.toml README.md* ./
COPY queen_pg/ queen_pg/
COPY sql/ sql/
COPY migrations/ migrations/
COPY alembic.ini ./
COPY webapp/ webapp/

# The package, its dependencies and the `queen-pg` command; the build leftovers go.
RUN pip install . \
    && rm -rf build queen_pg.egg-info

# The package finds sql/, migrations/ and webapp/ beside its source (queen_pg/db/apply.py sql_dir(),
# queen_pg/migrate.py migrations_dir(), queen_pg/app.py WEBAPP). Importing queen_pg from /app keeps
# them together whatever the wheel ships; `alembic` run in /app reads /app/alembic.ini.
ENV PYTHONPATH=/app

RUN useradd --system --uid 10001 --no-create-home --home-dir /app --shell /usr/sbin/nologin queen
USER queen

EXPOSE 6632
# the broker binds loopback by default; in a container the published port is the boundary
ENV QUEEN_HOST=0.0.0.0
CMD ["queen-pg", "serve"]
