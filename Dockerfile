# The faultwatch image: `docker build -t faultwatch .` (processor, agent, notify and actuate,
# with Faust and the Kubernetes client); `docker build --build-arg EXTRAS= -t faultwatch-node .`
# is the node side alone (no Faust, no Kubernetes client).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

ARG EXTRAS=processor,kubernetes
WORKDIR /src
# setup.py builds the matcher's optional C part (rules/_batchscan.c) where a compiler is found;
# python:3.11-slim has none, so this image runs the pure-Python reading (same results)
COPY pyproject.toml setup.py README.md ./
COPY faultwatch ./faultwatch
RUN pip install ".${EXTRAS:+[$EXTRAS]}" && rm -rf /src

RUN useradd --create-home --uid 10001 faultwatch
USER faultwatch
WORKDIR /home/faultwatch

ENTRYPOINT ["faultwatch"]
CMD ["--help"]
