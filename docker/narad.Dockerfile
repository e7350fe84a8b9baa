# The broker image (SPEC §10.1): the static (musl) `narad` binary FROM scratch, with the CA
# bundle, non-root UID/GID 10001, ports 7942 (API) and 7943 (cluster), data at
# /var/lib/narad. No base image is pulled: docker/build.sh stages the context (binary,
# CA bundle, passwd/group, an empty data dir) and builds this file.
FROM scratch
COPY etc/passwd etc/group /etc/
COPY etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --chown=10001:10001 var/lib/narad /var/lib/narad
COPY --chown=10001:10001 tmp /tmp
COPY bin/narad /usr/local/bin/narad
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
WORKDIR /var/lib/narad
VOLUME ["/var/lib/narad"]
EXPOSE 7942/tcp 7943/tcp
ENTRYPOINT ["narad"]
CMD ["server", "start", "--addr", "0.0.0.0:7942", "--data-dir", "/var/lib/narad"]
