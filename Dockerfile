# syntax=docker/dockerfile:1
# The wmark image. Default: the detection service and CLI (no torch, small).
#   docker build -t wmark .
#   docker build -t wmark-generator --build-arg EXTRAS=generate .   (torch + transformers, for GPUs)
ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS build
# the C fast paths (core/_fastprf.c, generator/cpu/_tree_attention.c) need a compiler at build time only
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core core
COPY detector detector
COPY scan scan
COPY generator generator
COPY eval eval
COPY keys keys
COPY api api
COPY cli cli
COPY integrations integrations
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:${PYTHON_VERSION}-slim-bookworm
ARG EXTRAS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WMARK_HOME=/var/lib/wmark
COPY --from=build /wheels /wheels
RUN wheel="$(ls /wheels/wmark-*.whl)" \
 && pip install --no-cache-dir "${wheel}${EXTRAS:+[$EXTRAS]}" \
 && rm -rf /wheels \
 && useradd --system --uid 10001 --create-home --home-dir /var/lib/wmark wmark
USER wmark
WORKDIR /var/lib/wmark
EXPOSE 8000
CMD ["wmark", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-migrate"]
