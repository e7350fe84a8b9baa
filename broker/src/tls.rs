//! TLS from PEM files, reloaded when the files change (cert-manager rotates the Secrets
//! behind them): the cluster port's mutual TLS (SPEC §4.5) and the client API's TLS.
//!
//! A [`TlsFiles`] names the files; [`ReloadingTls`] holds the rustls configurations built
//! from them and rebuilds them when a file's length or modification time changes (looked at
//! no more than once per [`RELOAD_CHECK`], on the next connection). At start every file must
//! exist and parse, and the key must match the certificate, or the node refuses to start: a
//! configured security setting that cannot be honoured is never downgraded. A later change
//! that does not load (a half-written rotation) keeps the previous configuration and is
//! logged once per change; the next change is tried again.
//!
//! Every configuration uses the ring provider (the workspace's one TLS stack). The cluster
//! port speaks TLS 1.3 only (both ends are Narad); the client API also offers TLS 1.2.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How often, at most, a connection makes the files be looked at again.
pub const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// Why TLS files could not be used. The message names the file and what is wrong with it,
/// never its content.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

fn err(msg: impl Into<String>) -> TlsError {
    TlsError(msg.into())
}

/// Which files make a TLS identity: a certificate chain and its key, and for mutual TLS the CA
/// that signs the peers' certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: Option<PathBuf>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    fs::read(path).map_err(|e| err(format!("{what} {}: {e}", path.display())))
}

/// Every certificate of a PEM file (at least one).
pub fn load_certs(what: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            err(format!(
                "{what} {}: not PEM certificates: {e}",
                path.display()
            ))
        })?;
    if certs.is_empty() {
        return Err(err(format!(
            "{what} {}: no certificate in the file",
            path.display()
        )));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(what: &str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(what, path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        err(format!(
            "{what} {}: no usable private key: {e}",
            path.display()
        ))
    })
}

/// A root store of every certificate in a CA file.
pub fn load_roots(what: &str, path: &Path) -> Result<rustls::RootCertStore, TlsError> {
    let pem = read(what, path)?;
    let mut roots = rustls::RootCertStore::empty();
    narad_api::client::add_ca_pem(&mut roots, &pem)
        .map_err(|e| err(format!("{what} {}: {e}", path.display())))?;
    Ok(roots)
}

/// The rustls configurations built from one version of the files.
#[derive(Clone)]
pub struct Built {
    pub server: Arc<rustls::ServerConfig>,
    /// For mutual TLS: the client side presenting the same identity.
    pub client: Option<Arc<rustls::ClientConfig>>,
}

/// Which kind of endpoint the files serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRole {
    /// The cluster port: TLS 1.3, client certificates required and verified against the CA,
    /// and a client configuration for calling peers.
    ClusterMutual,
    /// The client API: server authentication only.
    ApiServer,
}

fn build(files: &TlsFiles, role: TlsRole) -> Result<Built, TlsError> {
    let (cert_what, key_what, ca_what) = match role {
        TlsRole::ClusterMutual => (
            "cluster TLS certificate",
            "cluster TLS key",
            "cluster TLS CA",
        ),
        TlsRole::ApiServer => ("HTTP TLS certificate", "HTTP TLS key", "HTTP TLS CA"),
    };
    let certs = load_certs(cert_what, &files.cert)?;
    let key = load_key(key_what, &files.key)?;
    let mismatch = |e: rustls::Error| {
        err(format!(
            "{cert_what} {} and {key_what} {}: {e}",
            files.cert.display(),
            files.key.display()
        ))
    };
    match role {
        TlsRole::ApiServer => {
            let mut server = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(mismatch)?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(mismatch)?;
            server.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Built {
                server: Arc::new(server),
                client: None,
            })
        }
        TlsRole::ClusterMutual => {
            let ca = files
                .ca
                .as_deref()
                .ok_or_else(|| err("cluster TLS needs a CA file"))?;
            let roots = Arc::new(load_roots(ca_what, ca)?);
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                roots.clone(),
                provider(),
            )
            .build()
            .map_err(|e| err(format!("{ca_what} {}: {e}", ca.display())))?;
            let server = rustls::ServerConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(mismatch)?
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs.clone(), key.clone_key())
                .map_err(mismatch)?;
            let client = rustls::ClientConfig::builder_with_provider(provider())
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(mismatch)?
                .with_root_certificates(roots)
                .with_client_auth_cert(certs, key)
                .map_err(mismatch)?;
            Ok(Built {
                server: Arc::new(server),
                client: Some(Arc::new(client)),
            })
        }
    }
}

/// What identifies one version of the files: length and modification time of each.
type Fingerprint = Vec<Option<(u64, SystemTime)>>;

fn fingerprint(files: &TlsFiles) -> Fingerprint {
    [Some(&files.cert), Some(&files.key), files.ca.as_ref()]
        .into_iter()
        .flatten()
        .map(|p| {
            fs::metadata(p)
                .ok()
                .and_then(|m| Some((m.len(), m.modified().ok()?)))
        })
        .collect()
}

struct State {
    built: Built,
    /// The files' fingerprint when last looked at (loaded or not).
    seen: Fingerprint,
    checked_at: Instant,
}

/// TLS configurations that follow their files (see the module doc).
pub struct ReloadingTls {
    files: TlsFiles,
    role: TlsRole,
    state: Mutex<State>,
}

impl std::fmt::Debug for ReloadingTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingTls")
            .field("files", &self.files)
            .field("role", &self.role)
            .finish()
    }
}

impl ReloadingTls {
    /// Loads the files now; any problem is an error (the node must not start).
    pub fn load(files: TlsFiles, role: TlsRole) -> Result<Arc<ReloadingTls>, TlsError> {
        let seen = fingerprint(&files);
        let built = build(&files, role)?;
        Ok(Arc::new(ReloadingTls {
            files,
            role,
            state: Mutex::new(State {
                built,
                seen,
                checked_at: Instant::now(),
            }),
        }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The current configurations, reloading first if the files changed (checked at most
    /// once per [`RELOAD_CHECK`]).
    pub fn current(&self) -> Built {
        let mut st = self.state.lock();
        if st.checked_at.elapsed() >= RELOAD_CHECK {
            st.checked_at = Instant::now();
            let now = fingerprint(&self.files);
            if now != st.seen {
                st.seen = now;
                match build(&self.files, self.role) {
                    Ok(b) => {
                        tracing::info!(cert = %self.files.cert.display(), role = ?self.role, "TLS certificates reloaded");
                        st.built = b;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, role = ?self.role, "changed TLS files do not load; keeping the previous certificates");
                    }
                }
            }
        }
        st.built.clone()
    }

    /// Forces the next [`ReloadingTls::current`] to look at the files (tests).
    pub fn check_now(&self) {
        let mut st = self.state.lock();
        st.checked_at = Instant::now() - RELOAD_CHECK;
    }
}

/// The name a peer's certificate must carry, from a `host:port` address: a DNS name or an IP
/// address (`[v6]:port` too).
pub fn server_name(addr: &str) -> Result<rustls::pki_types::ServerName<'static>, TlsError> {
    let host = match addr.rsplit_once(':') {
        Some((h, _)) => h,
        None => addr,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| err(format!("{addr}: not a host name or IP address for TLS")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_from_addresses() {
        assert!(matches!(
            server_name("narad-0.narad-headless.ns.svc:7943").unwrap(),
            rustls::pki_types::ServerName::DnsName(_)
        ));
        assert!(matches!(
            server_name("127.0.0.1:7943").unwrap(),
            rustls::pki_types::ServerName::IpAddress(_)
        ));
        assert!(matches!(
            server_name("[::1]:7943").unwrap(),
            rustls::pki_types::ServerName::IpAddress(_)
        ));
        assert!(server_name("bad name:1").is_err());
    }

    #[test]
    fn missing_and_unparsable_files_are_named_errors() {
        let d = tempfile::tempdir().unwrap();
        let files = TlsFiles {
            cert: d.path().join("tls.crt"),
            key: d.path().join("tls.key"),
            ca: Some(d.path().join("ca.crt")),
        };
        let e = ReloadingTls::load(files.clone(), TlsRole::ClusterMutual).unwrap_err();
        assert!(e.to_string().contains("cluster TLS certificate"), "{e}");
        assert!(e.to_string().contains("tls.crt"), "{e}");
        fs::write(&files.cert, "not a pem").unwrap();
        fs::write(&files.key, "not a pem").unwrap();
        let e = ReloadingTls::load(files, TlsRole::ApiServer).unwrap_err();
        assert!(e.to_string().contains("HTTP TLS"), "{e}");
    }
}
