# The broker image (SPEC §10.1): the `narad` binary FROM scratch, with the CA bundle,
# non-root UID/GID 10001, ports 7942 (API) and 7943 (cluster), data at /var/lib/narad.
# No base image is pulled: docker/build.sh stages the context (rootfs/: the binary, CA
# bundle, passwd/group and, for host binaries, their shared libraries; data/ and tmp/:
# empty directories owned by the image's user) and builds this file.
FROM scratch
COPY rootfs/ /
COPY --chown=10001:10001 data/ /var/lib/narad/
COPY --chown=10001:10001 tmp/ /tmp/
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
WORKDIR /var/lib/narad
VOLUME ["/var/lib/narad"]
EXPOSE 7942/tcp 7943/tcp
ENTRYPOINT ["narad"]
CMD ["server", "start", "--addr", "0.0.0.0:7942", "--data-dir", "/var/lib/narad"]
