# Greenlight's container image: the tested dependency versions (requirements.lock) in a
# virtual environment built in one stage and copied alone into a slim, non-root final stage.
# The install steps are the README's ("Quick start", production without a container); a test
# (tests/test_release.py) checks that the two agree.

FROM python:3.11.14-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
RUN python -m venv /opt/greenlight
COPY requirements.lock ./
RUN /opt/greenlight/bin/pip install --no-cache-dir --no-deps -r requirements.lock
COPY pyproject.toml README.md manifest.yml alembic.ini ./
COPY bot ./bot
COPY agent ./agent
COPY storage ./storage
COPY migrations ./migrations
RUN /opt/greenlight/bin/pip install --no-cache-dir --no-deps .

FROM python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="Greenlight" \
      org.opencontainers.image.description="A Slack bot that puts a human between an AI agent and the actions it takes." \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/greenlight/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PORT=3000
RUN useradd --no-log-init --create-home --uid 10001 --user-group --shell /usr/sbin/nologin greenlight
COPY --from=build /opt/greenlight /opt/greenlight
USER 10001:10001
WORKDIR /home/greenlight
EXPOSE 3000
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["greenlight", "healthcheck"]
ENTRYPOINT ["greenlight"]
CMD ["serve"]
