# syntax=docker/dockerfile:1
# The `tessera` image: Debian 12, the release build of the production binary, non-root.
#
#   docker build -t tessera:0.1.0 .
#   docker run --rm tessera:0.1.0 version
#
# (docs/deploy.md, "The image"). Stage 1 builds with the project's own dependency script and
# the release preset; stage 2 is debian:12-slim with only the Debian packages of the shared
# libraries the binary loads (test/deploy/dockerfile_test.py checks the list against
# `ldd tessera-scheduler` and `dpkg -S`) and the stripped binary.
#
# The binary is `tessera-scheduler` (cmd/tessera/CMakeLists.txt): the production subcommands of
# the `tessera` CLI (serve, explain, decode, rbac, version) without its apisim,
# simulator and benchmark, and without cpp-httplib. It is installed as /usr/local/bin/tessera,
# so the manifests' `tessera serve ...` and `docker run tessera:0.1.0 version` are unchanged.
#
# HAMi's Helm chart runs the image as `command: [scheduler, --http_bind=0.0.0.0:443, ...]`
# (docs/deploy.md, "Migrating from HAMi's chart"): /usr/local/bin/scheduler links to the binary,
# which serves when invoked under that name, and the binary carries the file capability
# cap_net_bind_service, so the non-root user binds port 443. The chart sets no securityContext:
# the runtime's default capabilities include NET_BIND_SERVICE and privilege escalation is
# allowed, which file capabilities need. Manifests that drop ALL capabilities or set
# allowPrivilegeEscalation: false must listen on a port above 1023 (deploy/base uses 8443).

FROM debian:12 AS build
WORKDIR /src
COPY tools/install_deps.sh tools/install_deps.sh
RUN bash tools/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# .git is not in the context (.dockerignore): tessera_build_info's revision comes from here,
# `docker build --build-arg TESSERA_REVISION=$(git rev-parse --short=12 HEAD) .`
ARG TESSERA_REVISION=""
RUN rm -rf build \
 && cmake --preset release -DTESSERA_BUILD_TESTS=OFF -DTESSERA_BUILD_BENCHMARKS=OFF \
      -DTESSERA_REVISION="${TESSERA_REVISION}" \
 && cmake --build --preset release --target tessera-scheduler \
 && mkdir -p /out \
 && strip --strip-debug -o /out/tessera build/release/cmd/tessera/tessera-scheduler \
 && /out/tessera version

FROM debian:12-slim
# BEGIN RUNTIME PACKAGES (one per line; every library `ldd tessera-scheduler` names comes from one)
ARG RUNTIME_PACKAGES="\
 libabsl20220623 \
 libbrotli1 \
 libc6 \
 libcom-err2 \
 libcurl4 \
 libffi8 \
 libfmt9 \
 libgcc-s1 \
 libgmp10 \
 libgnutls30 \
 libgssapi-krb5-2 \
 libhogweed6 \
 libidn2-0 \
 libk5crypto3 \
 libkeyutils1 \
 libkrb5-3 \
 libkrb5support0 \
 libldap-2.5-0 \
 libnettle8 \
 libnghttp2-14 \
 libp11-kit0 \
 libprometheus-cpp-core1.0 \
 libpsl5 \
 librtmp1 \
 libsasl2-2 \
 libsimdjson14 \
 libssh2-1 \
 libssl3 \
 libstdc++6 \
 libtasn1-6 \
 libunistring2 \
 libyaml-cpp0.7 \
 libzstd1 \
 zlib1g \
"
# END RUNTIME PACKAGES
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${RUNTIME_PACKAGES} \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/tessera /usr/local/bin/tessera
# Fails the build if a library is missing from the list above. libcap2-bin (setcap) is installed
# for the one command and removed again.
RUN if ldd /usr/local/bin/tessera | grep -q "not found"; then ldd /usr/local/bin/tessera; exit 1; fi \
 && /usr/local/bin/tessera version \
 && ln -s tessera /usr/local/bin/scheduler \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends libcap2-bin \
 && setcap cap_net_bind_service=+ep /usr/local/bin/tessera \
 && apt-get purge -y --auto-remove libcap2-bin \
 && rm -rf /var/lib/apt/lists/*
# The uid/gid the manifests run as (deploy/base/deployment.yaml: runAsUser 65532).
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera"]
CMD ["serve"]
