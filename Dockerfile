# attnserve images. CPU (default):  docker build -t attnserve:cpu .
#                   GPU (CUDA 13):  docker build --target gpu -t attnserve:gpu .
# Runtime images hold the service's dependencies only: no torch, no compilers. The builders compile attnserve's two
# C extensions (service/runtime/_beam.c, beam search's per-step arithmetic; service/runtime/_attention.c, the fast decoder's attention
# kernels for ONNX Runtime, against the headers in third_party/onnxruntime) and keep gcc, pip and the build tree out
# of the final image; every dependency ships wheels.
# Settings are ATTNSERVE_* environment variables (docs/DEPLOY.md); the shipped bundles (model/bundles) are inside, and
# the server imports mounted Argos packages itself (the importer needs no torch).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- CPU builder: a virtual environment in /opt/venv ----
FROM ${PYTHON_IMAGE} AS cpu-builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (from pyproject.toml, see deploy/requirements.py), so a code change reuses this layer.
COPY pyproject.toml README.md ./
COPY deploy/requirements.py deploy/
RUN python deploy/requirements.py > requirements.txt && pip install --no-cache-dir -r requirements.txt
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
COPY third_party third_party
COPY service service
COPY model model
# The int8 graphs are derived from the shipped ones (service/runtime/derive.py) here: the runtime's bundles are read-only.
RUN pip install --no-cache-dir --no-deps . && attnserve derive model/bundles

# ---- GPU builder: the CPU builder's environment with onnxruntime-gpu INSTEAD of onnxruntime (never both: they share
# a module), one layer over it. The C extensions and the derived graphs are the CPU builder's: _attention.c reaches
# ONNX Runtime only through the API pointer that the runtime hands it, and the graphs are files. ----
FROM cpu-builder AS gpu-builder
RUN python deploy/requirements.py --gpu --no-cuda > requirements-gpu.txt \
    && pip uninstall --yes onnxruntime \
    && pip install --no-cache-dir -r requirements-gpu.txt

# ---- CUDA 13 and cuDNN 9: the nvidia-* wheels that onnxruntime-gpu loads (onnxruntime.preload_dlls()), pinned in
# pyproject.toml, installed where the environment's site-packages is. A stage of their own, so that the image's
# largest layer changes only with these pins; the host needs only the NVIDIA driver. ----
FROM ${PYTHON_IMAGE} AS cuda-libraries
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml ./
COPY deploy/requirements.py deploy/
RUN python -m venv /tmp/pip \
    && python deploy/requirements.py --cuda > cuda.txt \
    && site="/opt/venv/lib/$(python -c 'import sys; print("python%d.%d" % sys.version_info[:2])')/site-packages" \
    && /tmp/pip/bin/pip install --no-cache-dir --no-deps --target "$site" -r cuda.txt \
    && rm -rf /tmp/pip

# ---- GPU runtime: docker build --target gpu ----
FROM ${PYTHON_IMAGE} AS gpu
ARG VERSION=dev
LABEL org.opencontainers.image.title="attnserve (GPU)" \
      org.opencontainers.image.description="Machine-translation inference service with per-head attention (ONNX Runtime, CUDA 13)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# /var/cache/attnserve/argos: the Argos packages' import cache (docs/DEPLOY.md, "Argos packages"), owned by 10001 so
# that a named volume mounted there is created writable by the server.
RUN groupadd --system --gid 10001 attnserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin attnserve \
    && install -d -o 10001 -g 10001 /var/cache/attnserve/argos
# What changes least first: a change rebuilds the layers after it.
COPY --from=gpu-builder /src/model/bundles /opt/attnserve/bundles
COPY --from=cuda-libraries /opt/venv /opt/venv
COPY --from=gpu-builder /opt/venv /opt/venv
# NVIDIA_*: what NVIDIA's CUDA images set, so that the NVIDIA Container Toolkit mounts the driver's libraries.
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    ATTNSERVE_BUNDLES=/opt/attnserve/bundles ATTNSERVE_SHIPPED_BUNDLES=/opt/attnserve/bundles \
    ATTNSERVE_PROVIDER=cuda ATTNSERVE_ARGOS_CACHE=/var/cache/attnserve/argos \
    ATTNSERVE_HOST=0.0.0.0 ATTNSERVE_PORT=8000 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 10001:10001
WORKDIR /opt/attnserve
EXPOSE 8000
# /readyz is 200 once the model is loaded and warmed up; urllib raises (exit 1) on 503 or no answer.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('ATTNSERVE_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["attnserve"]
CMD ["serve"]

# ---- CPU runtime (the default target, so it comes last) ----
FROM ${PYTHON_IMAGE} AS cpu
ARG VERSION=dev
LABEL org.opencontainers.image.title="attnserve" \
      org.opencontainers.image.description="Machine-translation inference service with per-head attention (ONNX Runtime, CPU)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
# /var/cache/attnserve/argos: the Argos packages' import cache (docs/DEPLOY.md, "Argos packages"), owned by 10001 so
# that a named volume mounted there is created writable by the server.
RUN groupadd --system --gid 10001 attnserve \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin attnserve \
    && install -d -o 10001 -g 10001 /var/cache/attnserve/argos
COPY --from=cpu-builder /opt/venv /opt/venv
COPY --from=cpu-builder /src/model/bundles /opt/attnserve/bundles
ENV PATH=/opt/venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    ATTNSERVE_BUNDLES=/opt/attnserve/bundles ATTNSERVE_SHIPPED_BUNDLES=/opt/attnserve/bundles \
    ATTNSERVE_PROVIDER=cpu ATTNSERVE_ARGOS_CACHE=/var/cache/attnserve/argos \
    ATTNSERVE_HOST=0.0.0.0 ATTNSERVE_PORT=8000
USER 10001:10001
WORKDIR /opt/attnserve
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/readyz' % os.environ.get('ATTNSERVE_PORT', '8000'), timeout=4)"]
ENTRYPOINT ["attnserve"]
CMD ["serve"]
