# The operator image: the `narad-operator` binary FROM scratch, with the CA bundle,
# non-root UID/GID 10001. docker/build.sh stages the context (see narad.Dockerfile).
FROM scratch
COPY rootfs/ /
COPY --chown=10001:10001 tmp/ /tmp/
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
ENTRYPOINT ["narad-operator"]
CMD ["run"]
