# The faultwatch image: `docker build -t faultwatch .` (processor, agent, notify and actuate,
# with Faust and the Kubernetes client); `docker build --build-arg EXTRAS= -t faultwatch-node .`
# is the node side alone (no Faust, no Kubernetes client).
# The wheel is built in a stage of its own, on the Rust project's image (Debian bookworm, as
# python:3.11-slim is), so the image has the matcher's native fast path (native/,
# docs/rules.md "Native fast path"); the toolchain stays behind. A build without it (pip
# install . where no cargo is found) still works: every batch of lines then takes the
# pure-Python exact path (same results, about twice the CPU).
FROM rust:1.85-slim-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* && python3 -m venv /venv
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY native ./native
COPY faultwatch ./faultwatch
RUN /venv/bin/pip wheel --no-deps -w /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG EXTRAS=processor,kubernetes
COPY --from=build /wheels /wheels
RUN whl=$(ls /wheels/faultwatch-*.whl) && pip install "${whl}${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /wheels

RUN useradd --create-home --uid 10001 faultwatch
USER faultwatch
WORKDIR /home/faultwatch

ENTRYPOINT ["faultwatch"]
CMD ["--help"]
