# The operator image: the static (musl) `narad-operator` binary FROM scratch, with the CA
# bundle, non-root UID/GID 10001. docker/build.sh stages the context.
FROM scratch
COPY etc/passwd etc/group /etc/
COPY etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY bin/narad-operator /usr/local/bin/narad-operator
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 10001:10001
ENTRYPOINT ["narad-operator"]
CMD ["run"]
