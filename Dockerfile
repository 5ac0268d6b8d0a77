# The faultwatch image (processor and agent): `docker build -t faultwatch .`
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY faultwatch ./faultwatch
RUN pip install . && rm -rf /src

RUN useradd --create-home --uid 10001 faultwatch
USER faultwatch
WORKDIR /home/faultwatch

ENTRYPOINT ["faultwatch"]
CMD ["--help"]
