# The reference package's sandbox image (its docker/Dockerfile, ../shared/REFERENCE.md §1.5)
# rebuilt on a local Debian base, for hosts without a container registry.
#
# The package's own file starts FROM python:3.11-slim and pip-installs its Python libraries;
# here they come from Debian's packages (the local apt mirror) so the build needs neither a
# registry nor PyPI. Left out: `uv` (not packaged in bookworm; no benchmark row uses it).
# Built by bench/package_setup.sh as llm-in-sandbox-local:v0.1.
ARG BASE_IMAGE=sandhive-base:bookworm
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    TZ=America/Los_Angeles \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    LANG=C.UTF-8

RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      bash coreutils git curl wget ca-certificates build-essential tzdata \
      python3 python3-pip python3-numpy python3-sympy python3-scipy python3-matplotlib \
      python3-mpmath python3-chardet ipython3 \
 && ln -sf /usr/bin/python3 /usr/local/bin/python \
 && rm -rf /var/lib/apt/lists/*

RUN mkdir -p /testbed
WORKDIR /testbed
CMD ["bash"]
